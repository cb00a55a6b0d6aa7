// The head: ClusterSession, the Cluster capability a joined node calls.

#include "head/head.h"

#include <spdlog/spdlog.h>

#include "troupe/exit_codes.h"
#include "troupe/log.h"

namespace troupe {

// =======================================================================================
// ClusterSession

proto::Cluster::Client Head::session(kj::Maybe<Connection&> connection) {
  return kj::heap<ClusterSession>(*this, connection);
}

kj::Promise<void> ClusterSession::join(JoinContext call) {
  auto p = call.getParams();
  auto id = head_.join(NodeInfo::fromProto(p.getInfo()), p.getNode());
  KJ_IF_MAYBE(c, connection_) {
    head_.watchConnection(id, c->onDisconnect());
  }
  auto r = call.getResults();
  r.setNodeId(id);
  r.setHeartbeatMs(head_.node().options().heartbeatMs);
  r.setControlPort(head_.controlPort());
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::heartbeat(HeartbeatContext call) {
  auto p = call.getParams();
  KJ_IF_MAYBE(why, head_.heartbeat(p.getNodeId(), p.getLoad())) {
    auto r = call.getResults();
    r.setFenced(true);
    r.setReason(*why);
  }
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::spawn(SpawnContext call) {
  auto spec = call.getParams().getSpec();
  auto request = SpawnRequest::fromProto(spec);
  bool many = request.placement.isMultiInstance();
  return head_.spawnWhenPlaced(kj::mv(request), many)
      .then([this, call](kj::Array<ActorContext::Spawned> spawned) mutable {
        auto list = call.getResults().initActors(spawned.size());
        auto started = kj::heapArrayBuilder<kj::Promise<void>>(spawned.size());
        for (size_t i = 0; i < spawned.size(); ++i) {
          spawned[i].address.toProto(list[i]);
          started.add(head_.whenStarted(spawned[i].address.id));
        }
        // Reply once every instance runs, so the caller can resolve the addresses at once.
        return kj::joinPromises(started.finish());
      });
}

kj::Promise<void> ClusterSession::resolve(ResolveContext call) {
  auto id = call.getParams().getId();
  // An actor whose restart waits for capacity is resolved once it is placed, or has ended.
  return head_.whenPlaced(id).then([this, id, call]() mutable -> kj::Promise<void> {
    KJ_IF_MAYBE(a, head_.resolve(id)) {
      a->toProto(call.getResults().initActor());
      return kj::READY_NOW;
    }
    KJ_IF_MAYBE(why, head_.exitOf(id)) {
      return KJ_EXCEPTION(DISCONNECTED, kj::str("actor #", id, " has exited: ", why->describe()));
    }
    return KJ_EXCEPTION(DISCONNECTED, kj::str("actor #", id, " is not running"));
  });
}

kj::Promise<void> ClusterSession::lookup(LookupContext call) {
  auto name = call.getParams().getName();
  KJ_IF_MAYBE(a, head_.lookup(name)) {
    a->toProto(call.getResults().initActor());
    return kj::READY_NOW;
  }
  return KJ_EXCEPTION(FAILED, kj::str("no running actor is named '", name, "'"));
}

kj::Promise<void> ClusterSession::actorExited(ActorExitedContext call) {
  auto p = call.getParams();
  head_.actorExited(p.getId(), p.getIncarnation(), Exit::fromProto(p.getReason()));
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::link(LinkContext call) {
  head_.link(call.getParams().getA(), call.getParams().getB());
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::monitor(MonitorContext call) {
  head_.monitor(call.getParams().getTarget(), call.getParams().getWatcher());
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::stop(StopContext call) {
  return head_.stop(call.getParams().getId());
}

kj::Promise<void> ClusterSession::finish(FinishContext call) {
  auto p = call.getParams();
  head_.finish(p.getOk() ? OK : INTERRUPTED, p.getReason());
  return kj::READY_NOW;
}

kj::Promise<void> ClusterSession::leave(LeaveContext call) {
  auto p = call.getParams();
  head_.leave(p.getNodeId(), p.getReason());
  return kj::READY_NOW;
}

}  // namespace troupe
