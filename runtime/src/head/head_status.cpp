// Head::status(): the job as the head sees it, for `troupe status` (Gate.status). Read from the
// head's own books only: asking for it sends nothing to any other node.

#include <algorithm>

#include "head/head.h"
#include "troupe/sched/instance_types.h"

namespace troupe {

namespace {

int64_t msSince(kj::TimePoint then, kj::TimePoint now) {
  return (now - then) / kj::MILLISECONDS;
}

}  // namespace

void Head::status(proto::JobStatus::Builder out) const {
  auto now = node_.loop().timer().now();
  out.setHead(node_.info().host());
  out.setHeadAddress(node_.info().address());
  out.setPhase(finishing_ ? "ending" : driverRunning_ ? "running" : "forming");
  out.setUptimeMs(msSince(startedAt_, now));

  // Nodes, by host: those that joined (alive or lost), then those still expected.
  std::vector<const NodeEntry*> joined;
  for (auto& [id, n] : nodes_) joined.push_back(&n);
  std::sort(joined.begin(), joined.end(), [](auto* a, auto* b) {
    return strcmp(a->info.host().cStr(), b->info.host().cStr()) < 0;
  });
  auto& expected = view_.getExpectedHosts();
  auto nodes = out.initNodes(joined.size() + expected.size());
  size_t i = 0;
  for (auto* n : joined) {
    auto s = nodes[i++];
    n->info.toProto(s.initInfo());
    // toProto() writes this process's pid; a worker's is not kept.
    if (n->id != 1) s.getInfo().setPid(0);
    s.setState(n->draining && n->alive ? "draining"
               : n->alive              ? "alive"
               : n->left               ? "left"
                                       : "lost");
    int64_t age = -1;  // since its last heartbeat on the control path
    if (n->id != 1 && n->alive) {
      age = msSince(n->lastHeartbeat, now);
      if (control_) age = control_->silenceMs(n->id).value_or(age);
    }
    s.setHeartbeatAgeMs(age);
    s.setWhy(n->lostBecause);
    s.setLoadAgeMs(-1);
    KJ_IF_MAYBE(at, n->load.at) {
      s.setLoadAgeMs(msSince(*at, now));
      auto load = s.initLoad();
      load.setCpuPercent(n->load.cpuPercent);
      load.setIntervalMs(n->load.intervalMs);
      load.setHolds(n->load.holds);
      load.setLongestHoldMs(n->load.longestHoldMs);
      load.setLongestHoldBy(n->load.longestHoldBy);
    }
  }
  for (auto& e : expected) {
    auto s = nodes[i++];
    auto info = s.initInfo();
    info.setHost(e.host);
    info.setGroup(e.group);
    info.setInstanceType(e.instanceType);
    info.setAddress(node_.hosts().addressOf(e.host));
    if (auto type = sched::findInstanceType(e.instanceType)) {
      info.setVcpus(type->vcpus);
      info.setGpus(type->gpus);
    }
    s.setState("expected");
    s.setHeartbeatAgeMs(-1);
    s.setLoadAgeMs(-1);
  }

  auto groups = out.initGroups(node_.config().groups.size());
  i = 0;
  for (auto& g : node_.config().groups) {
    auto s = groups[i++];
    s.setName(g.name);
    s.setInstanceType(g.instanceType);
    auto hosts = s.initHosts(g.hosts.size());
    uint32_t alive = 0;
    for (size_t h = 0; h < g.hosts.size(); ++h) {
      hosts.set(h, g.hosts[h]);
      for (auto& [id, n] : nodes_) alive += n.alive && g.hosts[h] == n.info.host().cStr();
    }
    s.setAlive(alive);
  }

  // Actors in the head's directory, by id (start order). Their mailbox depth is what their node
  // reported last, for this incarnation.
  std::vector<const ActorEntry*> live;
  for (auto& [id, a] : actors_) {
    if (a.state != State::DEAD) live.push_back(&a);
  }
  auto actors = out.initActors(live.size());
  i = 0;
  for (auto* a : live) {
    auto s = actors[i++];
    a->address.toProto(s.initAddress());
    s.setParent(a->spec.parent);
    int64_t calls = -1;
    auto n = nodes_.find(a->address.nodeId);
    if (n != nodes_.end()) {
      auto reported = n->second.load.calls.find(a->address.id);
      if (reported != n->second.load.calls.end() &&
          reported->second.first == a->address.incarnation) {
        calls = reported->second.second;
      }
    }
    s.setCalls(calls);
    s.setState(a->state == State::STOPPING     ? "stopping"
               : a->state == State::RESTARTING ? "restarting (waiting for capacity)"
               : calls < 0                     ? "starting"
                                               : "running");
  }
}

}  // namespace troupe
