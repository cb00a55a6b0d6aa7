#include "troupe/actor.h"

#include <unistd.h>

#include "head.h"
#include "node.h"
#include "rebind.h"
#include "troupe/exit_codes.h"

namespace troupe {

// =======================================================================================
// Exit, ActorAddress

Exit Exit::fromProto(proto::ExitReason::Reader r) {
  return Exit{r.getKind(), r.getText()};
}

void Exit::toProto(proto::ExitReason::Builder b) const {
  b.setKind(kind);
  b.setText(text);
}

std::string Exit::describe() const {
  static const char* names[] = {"normal", "shutdown", "failed", "killed", "node lost", "no actor"};
  auto k = static_cast<unsigned>(kind);
  return std::string(k < 6 ? names[k] : "unknown") + ": " + text;
}

ActorAddress ActorAddress::fromProto(proto::ActorAddress::Reader r) {
  ActorAddress a;
  a.id = r.getId();
  a.incarnation = r.getIncarnation();
  a.nodeId = r.getNodeId();
  a.host = r.getHost();
  a.group = r.getGroup();
  a.address = r.getAddress();
  a.typeName = r.getTypeName();
  a.name = r.getName();
  a.restartable = r.getRestartable();
  return a;
}

void ActorAddress::toProto(proto::ActorAddress::Builder b) const {
  b.setId(id);
  b.setIncarnation(incarnation);
  b.setNodeId(nodeId);
  b.setHost(host);
  b.setGroup(group);
  b.setAddress(address);
  b.setTypeName(typeName);
  b.setName(name);
  b.setRestartable(restartable);
}

NodeInfo NodeInfo::fromProto(proto::NodeInfo::Reader r) {
  NodeInfo info;
  info.host_ = r.getHost();
  info.group_ = r.getGroup();
  info.instanceType_ = r.getInstanceType();
  info.address_ = r.getAddress();
  info.vcpus_ = r.getVcpus();
  info.gpus_ = r.getGpus();
  info.memoryBytes_ = r.getMemoryBytes();
  for (auto l : r.getLabels()) info.labels_[l.getKey()] = l.getValue();
  for (auto c : r.getResources()) info.resources_[c.getName()] = c.getMilli() / 1000.0;
  return info;
}

void NodeInfo::toProto(proto::NodeInfo::Builder b) const {
  b.setHost(host_);
  b.setGroup(group_);
  b.setInstanceType(instanceType_);
  b.setAddress(address_);
  b.setVcpus(vcpus_);
  b.setGpus(gpus_);
  b.setMemoryBytes(memoryBytes_);
  b.setPid(getpid());
  auto labels = b.initLabels(labels_.size());
  size_t i = 0;
  for (auto& [key, value] : labels_) {
    labels[i].setKey(key);
    labels[i++].setValue(value);
  }
  auto resources = b.initResources(resources_.size());
  i = 0;
  for (auto& [name, amount] : resources_) {
    resources[i].setName(name);
    resources[i++].setMilli(sched::toMilli(amount));
  }
}

std::string ActorAddress::describe() const {
  std::string who = name.empty() ? typeName + " #" + std::to_string(id)
                                 : "'" + name + "' (" + typeName + " #" + std::to_string(id) + ")";
  return who + " on " + host + " (" + group + ")";
}

// =======================================================================================
// Watching an actor: a local Watcher capability that fulfils a promise

namespace {

class PromiseWatcher final : public proto::Watcher::Server {
 public:
  explicit PromiseWatcher(kj::Own<kj::PromiseFulfiller<Exit>> fulfiller)
      : fulfiller_(kj::mv(fulfiller)) {}
  kj::Promise<void> down(DownContext call) override {
    fulfiller_->fulfill(Exit::fromProto(call.getParams().getReason()));
    return kj::READY_NOW;
  }

 private:
  kj::Own<kj::PromiseFulfiller<Exit>> fulfiller_;
};

kj::Promise<Exit> monitorThrough(proto::Cluster::Client cluster, uint64_t id) {
  auto paf = kj::newPromiseAndFulfiller<Exit>();
  auto req = cluster.monitorRequest();
  req.setTarget(id);
  req.setWatcher(kj::heap<PromiseWatcher>(kj::mv(paf.fulfiller)));
  return req.send().then([p = kj::mv(paf.promise)](auto&&) mutable { return kj::mv(p); });
}

}  // namespace

// =======================================================================================
// ActorContext

ActorContext::ActorContext(NodeRuntime& node, ActorAddress self, kj::Array<kj::byte> args,
                           uint32_t index, uint32_t count)
    : node_(node), self_(kj::mv(self)), index_(index), count_(count), argBytes_(kj::mv(args)) {}

const NodeInfo& ActorContext::node() const {
  return node_.info();
}
EventLoop& ActorContext::loop() {
  return node_.loop();
}

kj::Promise<kj::Array<ActorContext::Spawned>> ActorContext::spawnRaw(kj::StringPtr typeName,
                                                                     const Placement& placement,
                                                                     SpawnOptions options,
                                                                     bool many) {
  KJ_REQUIRE(many || !placement.isMultiInstance(), "a multi-instance placement needs spawnMany()",
             placement.describe());
  auto req = node_.cluster().spawnRequest();
  SpawnRequest spec;
  spec.typeName = typeName.cStr();
  spec.name = options.name;
  spec.args = kj::heapArray<kj::byte>(options.argBytes.data(), options.argBytes.size());
  spec.placement = placement;
  spec.parent = self_.id;
  spec.link = options.link;
  spec.maxRestarts = options.maxRestarts;
  spec.restartWindow = options.restartWindow;
  spec.stopTimeout = options.stopDeadline;
  spec.toProto(req.initSpec());
  return req.send().then([this](auto response) {
    auto list = response.getActors();
    auto out = kj::heapArrayBuilder<Spawned>(list.size());
    for (auto a : list) {
      auto address = ActorAddress::fromProto(a);
      out.add(Spawned{resolveRaw(address), kj::mv(address)});
    }
    return out.finish();
  });
}

proto::Actor::Client ActorContext::resolveRaw(const ActorAddress& address) {
  auto req = node_.peerNode(address.address).resolveRequest();
  req.setId(address.id);
  return rebinding(node_, address, req.send().getActor());
}

kj::Promise<ActorAddress> ActorContext::lookup(kj::StringPtr name) {
  auto req = node_.cluster().lookupRequest();
  req.setName(name);
  return req.send().then([](auto r) { return ActorAddress::fromProto(r.getActor()); });
}

kj::Promise<ActorAddress> ActorContext::current(uint64_t id) {
  auto req = node_.cluster().resolveRequest();
  req.setId(id);
  return req.send().then([](auto r) { return ActorAddress::fromProto(r.getActor()); });
}

kj::Promise<Exit> ActorContext::monitor(uint64_t id) {
  return monitorThrough(node_.cluster(), id);
}

kj::Promise<void> ActorContext::link(uint64_t id) {
  auto req = node_.cluster().linkRequest();
  req.setA(self_.id);
  req.setB(id);
  return req.send().ignoreResult();
}

void ActorContext::exit(Exit reason) {
  node_.actorExited(self_.id, kj::mv(reason));
}

// =======================================================================================
// ActorCore

ActorCore::ActorCore(ActorContext& context) : context_(&context) {
  if (trace::enabled()) {
    auto& a = self();
    trace::nameRow(trace::actorRow(a.id), (a.name.empty() ? "" : "'" + a.name + "' ") + a.typeName +
                                              " #" + std::to_string(a.id));
  }
}
ActorCore::~ActorCore() noexcept(false) {}

void ActorCore::checkAlive() const {
  KJ_IF_MAYBE(e, exited_) {
    kj::throwFatalException(KJ_EXCEPTION(
        DISCONNECTED, kj::str("actor ", self().describe(), " has exited (", e->describe(), ")")));
  }
}

namespace {

kj::Exception exitedDuringCall(const ActorAddress& self, const Exit& reason) {
  return KJ_EXCEPTION(DISCONNECTED, kj::str("actor ", self.describe(), " exited during the call (",
                                            reason.describe(), ")"));
}

}  // namespace

void ActorCore::markExited(const Exit& reason) {
  if (exited_ != nullptr) return;
  exited_ = reason;
  context_->work().close(
      kj::str("actor ", self().describe(), " has exited (", reason.describe(), ")"));
}

void ActorCore::cancelCalls() {
  KJ_IF_MAYBE(e, exited_) {
    canceler_.cancel(exitedDuringCall(self(), *e));
  }
}

kj::Promise<void> ActorCore::guard(kj::Promise<void> call) {
  // The continuations run while the call's context (and so this server) is alive.
  return canceler_.wrap(kj::mv(call))
      .then(
          [this]() -> kj::Promise<void> {
            // A method that ended its actor normally (exit(Exit::normal())) keeps its result.
            KJ_IF_MAYBE(e, exited_) {
              if (e->abnormal()) return exitedDuringCall(self(), *e);
            }
            return kj::READY_NOW;
          },
          [this](kj::Exception&& error) -> kj::Promise<void> {
            KJ_IF_MAYBE(e, exited_) {
              if (error.getType() != kj::Exception::Type::DISCONNECTED) {
                return exitedDuringCall(self(), *e);
              }
            }
            return kj::mv(error);
          });
}

kj::Promise<void> ActorCore::traceCall(kj::Promise<void> call, capnp::InterfaceSchema schema,
                                       uint64_t interfaceId, uint16_t methodId, int64_t start) {
  const char* name = "call";
  kj::Maybe<capnp::InterfaceSchema> declaring = schema;
  if (schema.getProto().getId() != interfaceId) declaring = schema.findSuperclass(interfaceId);
  KJ_IF_MAYBE(d, declaring) {
    auto methods = d->getMethods();
    // Compiled-in schema text: it lives as long as the process.
    if (methodId < methods.size()) name = methods[methodId].getProto().getName().cStr();
  }
  return trace::around(kj::mv(call), name, "actor", trace::actorRow(self().id), start);
}

kj::Promise<void> ActorCore::stopImpl() {
  auto req = context_->runtime().cluster().stopRequest();
  req.setId(self().id);
  return req.send().ignoreResult();
}

kj::Promise<void> ActorCore::linkImpl(uint64_t other) {
  return context_->link(other);
}

kj::Promise<void> ActorCore::monitorImpl(proto::Watcher::Client watcher) {
  auto req = context_->runtime().cluster().monitorRequest();
  req.setTarget(self().id);
  req.setWatcher(kj::mv(watcher));
  return req.send().ignoreResult();
}

// =======================================================================================
// Registry

std::string Registry::names() const {
  std::string out;
  for (auto& [name, f] : factories_) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "(none)" : out;
}

Registry::Created Registry::create(const std::string& typeName,
                                   kj::Own<ActorContext> context) const {
  auto it = factories_.find(typeName);
  if (it == factories_.end()) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED,
        kj::str("actor type '", typeName, "' is not registered; registered types: ", names())));
  }
  return it->second(kj::mv(context));
}

// =======================================================================================
// Driver

Driver::Driver(Head& head, std::vector<std::string> args) : head_(head), args_(kj::mv(args)) {}

kj::Array<ActorContext::Spawned> Driver::spawnRaw(kj::StringPtr typeName,
                                                  const Placement& placement, SpawnOptions options,
                                                  bool many) {
  SpawnRequest spec;
  spec.typeName = typeName.cStr();
  spec.name = options.name;
  spec.args = kj::heapArray<kj::byte>(options.argBytes.data(), options.argBytes.size());
  spec.placement = placement;
  spec.parent = 0;
  spec.link = options.link;
  spec.maxRestarts = options.maxRestarts;
  spec.restartWindow = options.restartWindow;
  spec.stopTimeout = options.stopDeadline;
  auto spawned = head_.spawn(kj::mv(spec), many);
  for (auto& s : spawned) s.client = rebinding(head_.node(), s.address, kj::mv(s.client));
  return spawned;
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

kj::Maybe<ActorAddress> Driver::lookup(kj::StringPtr name) {
  return head_.lookup(name);
}
kj::Maybe<ActorAddress> Driver::current(uint64_t actorId) {
  return head_.resolve(actorId);
}
const NodeInfo& Driver::node() const {
  return head_.node().info();
}
std::vector<NodeInfo> Driver::nodes() const {
  return head_.nodes();
}
EventLoop& Driver::loop() {
  return head_.node().loop();
}

// =======================================================================================

const char* exitCodeName(int code) {
  switch (code) {
    case OK:
      return "OK";
    case JOB_FAILED:
      return "JOB_FAILED";
    case CONFIG_ERROR:
      return "CONFIG_ERROR";
    case HEAD_LOST:
      return "HEAD_LOST";
    case AUTH_FAILED:
      return "AUTH_FAILED";
    case JOIN_FAILED:
      return "JOIN_FAILED";
    case INTERRUPTED:
      return "INTERRUPTED";
    case FENCED:
      return "FENCED";
    case INTERNAL_ERROR:
      return "INTERNAL_ERROR";
  }
  return "UNKNOWN";
}

}  // namespace troupe
