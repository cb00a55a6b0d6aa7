// The driver's side of the runtime: troupe::Driver over the head.

#include <kj/debug.h>

#include "actor/actor_host.h"
#include "head/head.h"
#include "actor/rebind.h"
#include "troupe/driver.h"

namespace troupe {

// =======================================================================================
// Driver

Driver::Driver(Head& head, std::vector<std::string> args) : head_(head), args_(kj::mv(args)) {}

static SpawnRequest driverRequest(Head& head, kj::StringPtr typeName, const Placement& placement,
                                  SpawnOptions& options) {
  SpawnRequest spec;
  spec.typeName = typeName.cStr();
  spec.name = options.name;
  spec.args = kj::heapArray<kj::byte>(options.argBytes.data(), options.argBytes.size());
  spec.placement = placement;
  spec.parent = 0;
  spec.link = options.link;
  spec.maxRestarts = options.maxRestarts;
  spec.restartWindow = options.restartWindow;
  spec.stopTimeout = stopDeadlineOf(options, head.node().options());
  spec.maxConcurrency = options.concurrency;
  spec.failCallOnly = options.methodError == MethodError::FAIL_CALL;
  spec.callDeadline = options.deadline;
  spec.waitForCapacity = options.capacityWait;
  spec.quiet = options.quietStart;
  return spec;
}

kj::Array<ActorContext::Spawned> Driver::spawnRaw(kj::StringPtr typeName,
                                                  const Placement& placement, SpawnOptions options,
                                                  bool many) {
  KJ_REQUIRE(options.capacityWait == nullptr,
             "SpawnOptions::waitForCapacity needs job.spawnAsync<T>() or spawnManyAsync<T>(): "
             "spawn() decides at once",
             typeName);
  auto spec = driverRequest(head_, typeName, placement, options);
  auto spawned = head_.spawn(kj::mv(spec), many);
  for (auto& s : spawned) s.client = rebinding(head_.node(), s.address, kj::mv(s.client));
  return spawned;
}

kj::Promise<kj::Array<ActorContext::Spawned>> Driver::spawnRawAsync(kj::StringPtr typeName,
                                                                    const Placement& placement,
                                                                    SpawnOptions options,
                                                                    bool many) {
  auto spec = driverRequest(head_, typeName, placement, options);
  return head_.spawnWhenPlaced(kj::mv(spec), many)
      .then([this](kj::Array<ActorContext::Spawned> spawned) {
        for (auto& s : spawned) s.client = rebinding(head_.node(), s.address, kj::mv(s.client));
        return kj::mv(spawned);
      });
}

Gang Driver::spawnGang(kj::ArrayPtr<GangMember> members) {
  auto requests = KJ_MAP(m, members) {
    KJ_REQUIRE(!m.placement.isMultiInstance(),
               "a gang member is one actor; a multi-instance placement cannot be one",
               m.placement.describe());
    return driverRequest(head_, m.typeName, m.placement, m.options);
  };
  auto spawned = head_.spawnGang(kj::mv(requests));
  for (auto& s : spawned) s.client = rebinding(head_.node(), s.address, kj::mv(s.client));
  return Gang(kj::mv(spawned), timer());
}

proto::Actor::Client Driver::resolveRaw(const ActorAddress& address) {
  auto req = head_.node().peerNode(address.address).resolveRequest();
  req.setId(address.id);
  return rebinding(head_.node(), address, req.send().getActor());
}

kj::Promise<void> Driver::stop(uint64_t actorId) {
  return head_.stop(actorId);
}

kj::Promise<Exit> Driver::monitor(uint64_t actorId) {
  return monitorThrough(head_.node().cluster(), actorId);
}
kj::Promise<Exit> Driver::monitor(uint64_t actorId,
                                  kj::Function<void(const Restarted&)> onRestart) {
  return monitorThrough(head_.node().cluster(), actorId, kj::mv(onRestart));
}

kj::Maybe<ActorAddress> Driver::lookup(kj::StringPtr name) {
  return head_.lookup(name);
}
kj::Maybe<ActorAddress> Driver::current(uint64_t actorId) {
  return head_.resolve(actorId);
}
const NodeInfo& Driver::node() const {
  return head_.node().info();
}
const SageMakerEnv& Driver::sagemaker() const {
  return head_.node().sagemaker();
}
std::vector<NodeInfo> Driver::nodes() const {
  return head_.nodes();
}
EventLoop& Driver::loop() {
  return head_.node().loop();
}

void Driver::onNodeJoined(kj::Function<void(const NodeInfo&)> callback) {
  head_.onNodeJoined(kj::mv(callback));
}

void Driver::onJobEnd(kj::Function<void(const JobEnd&)> callback) {
  head_.onJobEnd(kj::mv(callback));
}

std::vector<std::string> Driver::membershipChanges() const {
  return head_.membershipChanges();
}

}  // namespace troupe
