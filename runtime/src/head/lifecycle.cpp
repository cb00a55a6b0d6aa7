// The head: links, monitors and exits: the lifecycle state machine of docs/lifecycle.md.

#include "head/head.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "troupe/exit_codes.h"
#include "troupe/log.h"
#include "troupe/sched/decide.h"

namespace troupe {

// =======================================================================================
// Links, monitors, exits

void Head::link(uint64_t a, uint64_t b) {
  for (auto id : {a, b}) {
    auto* e = findActor(id);
    if (e == nullptr || e->state != State::RUNNING) {
      kj::throwFatalException(
          KJ_EXCEPTION(DISCONNECTED, kj::str("cannot link: actor #", id, " is not running")));
    }
  }
  actors_.at(a).links.insert(b);
  actors_.at(b).links.insert(a);
}

void Head::monitor(uint64_t target, proto::Watcher::Client watcher) {
  auto* e = findActor(target);
  if (e != nullptr && e->state != State::DEAD) {
    e->watchers.push_back(kj::mv(watcher));
    return;
  }
  // Dead already, or never existed: one `down` now.
  Exit reason;
  auto it = tombstones_.find(target);
  if (it != tombstones_.end()) {
    reason = it->second;
  } else {
    reason = Exit{ExitKind::NO_ACTOR, "no actor #" + std::to_string(target) + " ever existed"};
  }
  auto req = watcher.downRequest();
  req.setId(target);
  reason.toProto(req.initReason());
  tasks_.add(req.send().ignoreResult());
}

std::string Head::originLine(const ActorEntry& entry, const Exit& reason) const {
  return "actor " + entry.address.describe() + " " +
         (reason.kind == ExitKind::NODE_LOST ? "was lost" : "failed") + ": " + reason.text;
}

void Head::actorExited(uint64_t id, uint32_t incarnation, Exit reason) {
  auto* e = findActor(id);
  if (e == nullptr || e->state != State::RUNNING || e->address.incarnation != incarnation) return;
  if (reason.abnormal()) reason.text = originLine(*e, reason);
  tasks_.add(terminate(id, kj::mv(reason), true, true));
}

void Head::nodeLost(uint32_t nodeId, std::string why) {
  auto* n = findNode(nodeId);
  if (n == nullptr || !n->alive) return;
  n->alive = false;
  n->lostBecause = "node " + nodeLine(n->info) + " was lost: " + why;
  if (control_) control_->fence(nodeId, why);
  view_.setState(nodeId, sched::NodeState::LOST);
  if (finishing_) {
    spdlog::debug("{} left: {}", nodeLine(n->info), why);
    return;
  }
  spdlog::error("node {} was lost: {}", nodeLine(n->info), why);
  if (driverRunning_) membership_.push_back(nodeLine(n->info) + " was lost: " + why);
  fence(*n, why);
  std::vector<uint64_t> hosted;
  for (auto& [id, a] : actors_) {
    if (a.address.nodeId == nodeId && a.state == State::RUNNING) hosted.push_back(id);
  }
  auto text = "node " + nodeLine(n->info) + " was lost: " + why;
  for (auto id : hosted) {
    auto* a = findActor(id);
    if (a == nullptr || a->state != State::RUNNING) continue;
    Exit reason{ExitKind::NODE_LOST, originLine(*a, Exit{ExitKind::NODE_LOST, text})};
    tasks_.add(terminate(id, reason, true, true));
  }
}

void Head::fence(NodeEntry& lost, const std::string& why) {
  // The head's word is final: the node is cut off before its actors are restarted elsewhere, so
  // two incarnations never serve the same calls. Every other node drops its connections to it,
  // which fails calls in flight to its actors with DISCONNECTED at once (a partition closes no
  // socket by itself).
  std::string host = lost.info.host().cStr(), address = lost.info.address().cStr();
  auto incarnation = lost.info.incarnation();
  for (auto& [id, n] : nodes_) {
    if (id == 1 || !n.alive) continue;
    auto req = n.client.peerLostRequest();
    req.setHost(host);
    req.setAddress(address);
    req.setReason(why);
    req.setIncarnation(incarnation);
    tasks_.add(req.send().ignoreResult());
  }
  // Tell the node itself, in case it can still hear (a freeze it wakes from: the request waits
  // in its socket), then cut it off here too: after its answer, or after a short wait that lets
  // the request reach the kernel if it cannot answer.
  auto req = lost.client.fenceRequest();
  req.setReason(why);
  tasks_.add(node_.loop()
                 .timer()
                 .timeoutAfter(100 * kj::MILLISECONDS, req.send().ignoreResult())
                 .then([]() {}, [](kj::Exception&&) {})
                 .then([this, host, address, why, incarnation]() {
                   node_.fencePeer(host, address, why, incarnation);
                 }));
}

kj::Promise<void> Head::stop(uint64_t id) {
  return terminate(id, Exit::shutdown("stopped"), false, false);
}

kj::Promise<void> Head::terminate(uint64_t id, Exit reason, bool alreadyGone, bool mayRestart) {
  auto* e = findActor(id);
  if (e != nullptr && e->state == State::RESTARTING) {
    // Nothing runs: no children, nothing on a node. It ends with this reason, not a restart.
    endRestartWait(id, kj::mv(reason));
    return kj::READY_NOW;
  }
  if (e == nullptr || e->state != State::RUNNING) return kj::READY_NOW;
  e->state = State::STOPPING;
  return stopChildren(id)
      .then([this, id, reason, alreadyGone]() -> kj::Promise<void> {
        auto* e = findActor(id);
        if (alreadyGone || e == nullptr) return kj::READY_NOW;
        return stopOnNode(*e, reason);
      })
      .then([this, id, reason, mayRestart]() mutable {
        auto* e = findActor(id);
        if (e == nullptr) return;
        releaseResources(*e);
        if (mayRestart && reason.abnormal() && !finishing_ && tryRestart(*e, reason)) return;
        finalize(id, reason);
      });
}

kj::Promise<void> Head::stopChildren(uint64_t id) {
  auto* e = findActor(id);
  if (e == nullptr) return kj::READY_NOW;
  // Reverse start order, one at a time, like an OTP supervisor.
  std::vector<uint64_t> children(e->children.rbegin(), e->children.rend());
  kj::Promise<void> chain = kj::READY_NOW;
  for (auto child : children) {
    chain = chain.then([this, child]() {
      return terminate(child, Exit::shutdown("its parent is stopping"), false, false);
    });
  }
  return chain;
}

kj::Promise<void> Head::stopOnNode(ActorEntry& entry, Exit reason) {
  auto* n = findNode(entry.address.nodeId);
  if (n == nullptr || !n->alive) return kj::READY_NOW;
  auto req = n->client.stopRequest();
  req.setId(entry.address.id);
  reason.toProto(req.initReason());
  auto timeout = entry.spec.stopTimeout;
  req.setTimeoutMs(timeout / kj::MILLISECONDS);
  auto client = n->client;
  auto id = entry.address.id;
  auto description = entry.address.describe();
  // The node enforces the deadline; this one covers a node that does not answer at all.
  return node_.loop()
      .timer()
      .timeoutAfter(timeout + 2 * kj::SECONDS, req.send().ignoreResult())
      .catch_([this, client, id, reason, description](kj::Exception&& e) mutable {
        spdlog::warn("stopping {} failed ({}); killing it", description, e.getDescription().cStr());
        auto kill = client.killRequest();
        kill.setId(id);
        Exit{ExitKind::KILLED, reason.text}.toProto(kill.initReason());
        tasks_.add(kill.send().ignoreResult());
      });
}

void Head::releaseResources(ActorEntry& entry) {
  if (!entry.reserved) return;
  entry.reserved = false;
  if (view_.findNode(entry.address.nodeId) != nullptr) {
    view_.release(entry.address.nodeId, entry.spec.placement.getResources());
  }
  capacityChanged();
}

bool Head::tryRestart(ActorEntry& entry, Exit& reason) {
  if (entry.spec.maxRestarts == 0) return false;
  auto now = node_.loop().timer().now();
  while (!entry.restarts.empty() && now - entry.restarts.front() > entry.spec.restartWindow) {
    entry.restarts.pop_front();
  }
  if (entry.restarts.size() >= entry.spec.maxRestarts) {
    reason.text += kj::str(" (restart limit reached: ", entry.spec.maxRestarts, " within ",
                           entry.spec.restartWindow / kj::MILLISECONDS, " ms)")
                       .cStr();
    return false;
  }
  auto decision = sched::place(view_, entry.spec.placement);
  auto* placed = std::get_if<sched::Placed>(&decision);
  if (placed != nullptr && view_.reserve(placed->nodeId, entry.spec.placement.getResources())) {
    entry.restarts.push_back(now);
    restartOn(entry, placed->nodeId, reason);
    return true;
  }
  std::string why = "no capacity";
  bool mayFitLater = true;
  if (auto* u = std::get_if<sched::Unschedulable>(&decision)) {
    why = u->reason;
    mayFitLater = u->fitsWhenFree;
  } else if (auto* w = std::get_if<sched::Wait>(&decision)) {
    why = "not yet: " + w->reason;
  }
  if (entry.spec.waitForCapacity != nullptr && mayFitLater) {
    // The restart counts against the limit now; it happens when capacity frees up.
    entry.restarts.push_back(now);
    waitToRestart(entry, reason, why);
    return true;
  }
  reason.text += " (could not restart it: " + why + ")";
  return false;
}

void Head::restartOn(ActorEntry& entry, uint32_t nodeId, const Exit& reason) {
  entry.reserved = true;
  entry.state = State::RUNNING;
  entry.children.clear();
  auto incarnation = entry.address.incarnation + 1;
  entry.address = addressFor(entry.address.id, incarnation, nodeId, entry.spec);
  spdlog::warn("restarting {} (restart {} of {}) after: {}", entry.address.describe(),
               entry.restarts.size(), entry.spec.maxRestarts, reason.text);
  hostOn(entry);
  // Every node first, so that where a monitor hears of the restart, references there already
  // know to ask for the new incarnation (the same connection keeps the order; the head's own node
  // is told at once).
  node_.noteRestart(entry.address.id, incarnation);
  for (auto& [id, n] : nodes_) {
    if (id == 1 || !n.alive) continue;
    auto req = n.client.actorRestartedRequest();
    req.setId(entry.address.id);
    req.setIncarnation(incarnation);
    tasks_.add(req.send().ignoreResult());
  }
  // Monitors hear of every restart (their `down` comes once, at the end); links do not fire: the
  // actor lives on, linked as before.
  for (auto& w : entry.watchers) {
    auto req = w.restartedRequest();
    req.setId(entry.address.id);
    req.setIncarnation(incarnation);
    reason.toProto(req.initReason());
    tasks_.add(req.send().ignoreResult());
  }
}

void Head::waitToRestart(ActorEntry& entry, const Exit& reason, const std::string& why) {
  auto id = entry.address.id;
  auto wait = KJ_ASSERT_NONNULL(entry.spec.waitForCapacity);
  auto ms = wait / kj::MILLISECONDS;
  spdlog::warn("{} does not fit now ({}); its restart waits up to {} ms for capacity, after: {}",
               entry.address.describe(), why, ms, reason.text);
  entry.state = State::RESTARTING;
  entry.children.clear();
  // Whoever waits for it to start (a rebinding reference's resolve) waits for the new incarnation.
  auto paf = kj::newPromiseAndFulfiller<void>();
  entry.started = paf.promise.fork();
  auto serial = nextWaiting_++;
  restartWaits_.erase(id);
  restartWaits_.emplace(id, RestartWait{reason, why, kj::mv(paf.fulfiller), serial});
  tasks_.add(node_.loop().timer().afterDelay(wait).then([this, id, serial, ms]() {
    auto it = restartWaits_.find(id);
    if (it == restartWaits_.end() || it->second.serial != serial) return;
    auto reason = it->second.reason;
    reason.text += kj::str(" (could not restart it within ", ms,
                           " ms (SpawnOptions::waitForCapacity): ", it->second.why.c_str(), ")")
                       .cStr();
    endRestartWait(id, kj::mv(reason));
  }));
}

void Head::retryRestarts() {
  std::vector<uint64_t> ids;
  for (auto& [id, w] : restartWaits_) ids.push_back(id);
  for (auto id : ids) {
    auto* e = findActor(id);
    auto it = restartWaits_.find(id);
    if (it == restartWaits_.end()) continue;
    if (e == nullptr || e->state != State::RESTARTING) {
      restartWaits_.erase(it);
      continue;
    }
    if (finishing_) {
      auto reason = it->second.reason;
      reason.text += " (not restarted: the job is ending)";
      endRestartWait(id, kj::mv(reason));
      continue;
    }
    auto decision = sched::place(view_, e->spec.placement);
    auto* placed = std::get_if<sched::Placed>(&decision);
    if (placed != nullptr && view_.reserve(placed->nodeId, e->spec.placement.getResources())) {
      auto wait = kj::mv(it->second);
      restartWaits_.erase(it);
      restartOn(*e, placed->nodeId, wait.reason);
      // Those waiting for the stand-in now wait for the new incarnation's start.
      KJ_IF_MAYBE(started, e->started) {
        tasks_.add(started->addBranch().then(
            [f = kj::mv(wait.placed)]() mutable { f->fulfill(); }, [](kj::Exception&&) {}));
      }
      continue;
    }
    if (auto* u = std::get_if<sched::Unschedulable>(&decision)) {
      it->second.why = u->reason;
    } else if (auto* w = std::get_if<sched::Wait>(&decision)) {
      it->second.why = "not yet: " + w->reason;
    } else {
      it->second.why = "no capacity";
    }
  }
}

void Head::endRestartWait(uint64_t id, Exit reason) {
  auto it = restartWaits_.find(id);
  if (it != restartWaits_.end()) {
    it->second.placed->reject(KJ_EXCEPTION(DISCONNECTED, kj::str(reason.describe().c_str())));
    restartWaits_.erase(it);
  }
  auto* e = findActor(id);
  if (e == nullptr || e->state != State::RESTARTING) return;
  spdlog::info("{}: its restart no longer waits: {}", e->address.describe(), reason.describe());
  e->state = State::STOPPING;
  finalize(id, kj::mv(reason));
}

void Head::finalize(uint64_t id, Exit reason) {
  auto it = actors_.find(id);
  if (it == actors_.end()) return;
  auto entry = kj::mv(it->second);
  actors_.erase(it);
  if (entry.address.nodeId == 1 && !finishing_) announceHeadActors();
  tombstones_[id] = reason;
  if (!entry.spec.name.empty()) names_.erase(entry.spec.name);
  auto* siblings = &rootChildren_;
  if (entry.spec.parent != 0) {
    auto* parent = findActor(entry.spec.parent);
    siblings = parent != nullptr ? &parent->children : nullptr;
  }
  if (siblings != nullptr) {
    siblings->erase(std::remove(siblings->begin(), siblings->end(), id), siblings->end());
  }
  if (reason.abnormal()) {
    spdlog::warn("{} exited: {}", entry.address.describe(), firstLine(reason.describe()));
  } else {
    spdlog::debug("{} exited: {}", entry.address.describe(), reason.describe());
  }
  for (auto& w : entry.watchers) {
    auto req = w.downRequest();
    req.setId(id);
    reason.toProto(req.initReason());
    tasks_.add(req.send().ignoreResult());
  }
  for (auto other : entry.links) {
    if (other != 0) {
      auto* o = findActor(other);
      if (o != nullptr) o->links.erase(id);
    }
  }
  if (!reason.abnormal()) return;
  // An abnormal exit travels along links with the same reason.
  for (auto other : entry.links) {
    if (other == 0) {
      finish(JOB_FAILED, reason.text);
    } else {
      tasks_.add(terminate(other, reason, false, true));
    }
  }
}

}  // namespace troupe
