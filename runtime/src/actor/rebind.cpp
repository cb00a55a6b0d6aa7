#include "actor/rebind.h"

#include <spdlog/spdlog.h>

#include "actor/actor_host.h"

namespace troupe {

namespace {

class Rebinder final : public capnp::Capability::Server {
 public:
  Rebinder(ActorHost& node, ActorAddress address, proto::Actor::Client direct)
      : node_(node), address_(kj::mv(address)), target_(kj::mv(direct)) {}

  DispatchCallResult dispatchCall(
      uint64_t interfaceId, uint16_t methodId,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) override {
    if (!stale_ && node_.latestIncarnation(address_.id) <= address_.incarnation) {
      return {send(interfaceId, methodId, context), false};
    }
    return {refresh().then([this, interfaceId, methodId, context]() mutable {
              return send(interfaceId, methodId, context);
            }),
            false};
  }

 private:
  kj::Promise<void> send(uint64_t interfaceId, uint16_t methodId,
                         capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
    auto params = context.getParams();
    auto req = target_.typelessRequest(interfaceId, methodId, params.targetSize());
    req.set(params);
    context.releaseParams();
    return context.tailCall(kj::mv(req)).catch_([this](kj::Exception&& e) -> kj::Promise<void> {
      // Any failure may have ended the incarnation (a method that threw restarts the actor; its
      // node may be gone): ask the head before the next call. If it lives on, the head says so.
      stale_ = true;
      return kj::mv(e);
    });
  }

  kj::Promise<void> refresh() {
    // Concurrent calls share one question to the head. (The fork is replaced only once it has
    // finished, never from inside its own continuation.)
    if (refreshInFlight_) return KJ_ASSERT_NONNULL(refreshing_).addBranch();
    refreshInFlight_ = true;
    auto req = node_.cluster().resolveRequest();
    req.setId(address_.id);
    auto done = req.send()
                    .then(
                        [this](auto r) {
                          auto now = ActorAddress::fromProto(r.getActor());
                          if (now.incarnation != address_.incarnation) {
                            spdlog::info("calls to {} now go to incarnation {} on {}",
                                         address_.describe(), now.incarnation, now.host);
                          }
                          auto resolve = node_.peerNode(now.address).resolveRequest();
                          resolve.setId(now.id);
                          target_ = resolve.send().getActor();
                          address_ = kj::mv(now);
                        },
                        [this](kj::Exception&& e) {
                          // Not running any more, for good: every later call fails with why.
                          target_ = capnp::Capability::Client(capnp::newBrokenCap(kj::mv(e)))
                                        .castAs<proto::Actor>();
                        })
                    .then([this]() {
                      stale_ = false;
                      refreshInFlight_ = false;
                    });
    auto forked = done.fork();
    auto branch = forked.addBranch();
    refreshing_ = kj::mv(forked);
    return branch;
  }

  ActorHost& node_;
  ActorAddress address_;
  proto::Actor::Client target_;
  bool stale_ = false;
  bool refreshInFlight_ = false;
  kj::Maybe<kj::ForkedPromise<void>> refreshing_;
};

}  // namespace

proto::Actor::Client rebinding(ActorHost& node, ActorAddress address, proto::Actor::Client direct) {
  if (!address.restartable) return direct;
  auto proxy = kj::heap<Rebinder>(node, kj::mv(address), kj::mv(direct));
  return capnp::Capability::Client(kj::mv(proxy)).castAs<proto::Actor>();
}

}  // namespace troupe
