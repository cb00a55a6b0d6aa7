// A node's actors: starting one a spawn placed here, finding it for a caller, stopping and
// retiring it, the event-loop holds of its methods and what the node reports of them with its
// heartbeats. The rest of NodeRuntime (its port, connections and peers) is node.cpp.

#include <spdlog/spdlog.h>

#include <algorithm>

#include "node/node.h"
#include "trace/trace_collect.h"
#include "troupe/exit_codes.h"
#include "troupe/log.h"

namespace troupe {

proto::Actor::Client NodeRuntime::host(proto::SpawnSpec::Reader spec, ActorAddress address) {
  std::string type = spec.getTypeName();
  KJ_REQUIRE(!exiting(), "node is exiting; not starting more actors", info_.host());
  if (!registry_.has(type)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("actor type '", type, "' is not registered on ", info_.host(),
                        "; registered types: ", registry_.names(),
                        ". Register it in main() with Registry::add<T>(\"", type, "\")")));
  }
  auto id = address.id;
  KJ_REQUIRE(actors_.count(id) == 0, "actor already hosted here", id);
  CallPolicy policy;
  policy.maxConcurrency = kj::max(spec.getMaxConcurrency(), 1u);
  policy.failCallOnly = spec.getFailCallOnly();
  if (spec.getCallDeadlineMs() > 0) policy.deadline = spec.getCallDeadlineMs() * kj::MILLISECONDS;
  auto context = kj::heap<ActorContext>(*this, address, kj::heapArray(spec.getArgs()),
                                        spec.getIndex(), spec.getCount(), kj::mv(policy));
  auto created = registry_.create(type, kj::mv(context));
  Hosted hosted{address, created.client, &created.core, spec.getStopTimeoutMs() * kj::MILLISECONDS};
  auto& core = created.core;
  hosted.started = kj::evalLater([&core]() { return core.onStart(); })
                       .then([]() {},
                             [this, id](kj::Exception&& e) {
                               actorExited(id, Exit::failed(e.getDescription().cStr()));
                             })
                       .eagerlyEvaluate(nullptr);
  spdlog::debug("hosting {}", address.describe());
  actors_.emplace(id, kj::mv(hosted));
  hostedEver_.insert(id);
  auto waiting = awaitingHost_.find(id);
  if (waiting != awaitingHost_.end()) {
    for (auto& f : waiting->second) f->fulfill();
    awaitingHost_.erase(waiting);
  }
  return created.client;
}

kj::Promise<kj::Maybe<proto::Actor::Client>> NodeRuntime::findOrAwait(uint64_t id) {
  KJ_IF_MAYBE(client, find(id)) { return kj::Maybe<proto::Actor::Client>(*client); }
  if (hostedEver_.count(id) > 0 || exiting()) return kj::Maybe<proto::Actor::Client>(nullptr);
  // Waits that ended (timed out, their caller gone) leave fulfillers nobody waits on.
  for (auto it = awaitingHost_.begin(); it != awaitingHost_.end();) {
    auto& waits = it->second;
    waits.erase(std::remove_if(waits.begin(), waits.end(), [](auto& f) { return !f->isWaiting(); }),
                waits.end());
    it = waits.empty() ? awaitingHost_.erase(it) : std::next(it);
  }
  auto paf = kj::newPromiseAndFulfiller<void>();
  awaitingHost_[id].push_back(kj::mv(paf.fulfiller));
  return loop_.timer()
      .timeoutAfter(kHostAwait, kj::mv(paf.promise))
      .then([this, id]() { return find(id); },
            // Not hosted within the bound (or this node is going away): nothing.
            [](kj::Exception&&) { return kj::Maybe<proto::Actor::Client>(nullptr); });
}

kj::Maybe<proto::Actor::Client> NodeRuntime::find(uint64_t id) {
  auto it = actors_.find(id);
  if (it == actors_.end() || it->second.core->exited()) return nullptr;
  return it->second.client;
}

void NodeRuntime::retire(uint64_t id, Exit reason) {
  auto it = actors_.find(id);
  if (it == actors_.end()) return;
  it->second.core->markExited(reason);
  // Out of the directory at once (the same id may be hosted here again by a restart), but kept
  // alive until it is safe to let it go: we may be inside one of its calls or its onStart(), so
  // its calls are cancelled once the queued work has run, and a job it offloaded may still run on
  // the pool and touch what it owns, so it is dropped only once those have returned.
  auto serial = nextRetired_++;
  retiring_.emplace(serial, kj::mv(it->second));
  actors_.erase(it);
  // evalLast: a call that is completing as the actor exits (it called exit() and returned)
  // delivers its result first.
  tasks_.add(kj::evalLast([this, serial]() {
    auto& hosted = retiring_.at(serial);
    hosted.started = nullptr;
    hosted.core->cancelCalls();
    return hosted.core->context().work().whenIdle().then(
        [this, serial]() { retiring_.erase(serial); });
  }));
}

kj::Promise<void> NodeRuntime::stopActor(uint64_t id, Exit reason, kj::Duration timeout) {
  auto it = actors_.find(id);
  if (it == actors_.end() || it->second.stopping || it->second.core->exited()) {
    return kj::READY_NOW;
  }
  auto& hosted = it->second;
  hosted.stopping = true;
  hosted.started = nullptr;  // cancel onStart() work still running
  auto* core = hosted.core;
  auto description = hosted.address.describe();
  return loop_.timer()
      .timeoutAfter(timeout, kj::evalNow([core]() { return core->onStop(); }))
      .then([]() -> kj::Maybe<kj::Exception> { return nullptr; },
            [](kj::Exception&& e) -> kj::Maybe<kj::Exception> { return kj::mv(e); })
      .then([this, id, core, reason, description, timeout](kj::Maybe<kj::Exception> error) {
        KJ_IF_MAYBE(e, error) {
          spdlog::warn("actor {} did not stop cleanly within {} ms: {}", description,
                       timeout / kj::MILLISECONDS, e->getDescription().cStr());
        }
        // Still the same incarnation (a kill may have retired it meanwhile).
        auto it = actors_.find(id);
        if (it != actors_.end() && it->second.core == core) retire(id, reason);
      });
}

void NodeRuntime::killActor(uint64_t id, Exit reason) {
  retire(id, kj::mv(reason));
}

kj::Promise<void> NodeRuntime::stopAll(Exit reason) {
  kj::Promise<void> chain = kj::READY_NOW;
  for (auto it = actors_.rbegin(); it != actors_.rend(); ++it) {
    auto id = it->first;
    auto timeout = it->second.stopTimeout;
    chain = chain.then([this, id, reason, timeout]() { return stopActor(id, reason, timeout); });
  }
  return chain;
}

void NodeRuntime::loopHeld(const ActorAddress& actor, const std::string& method, int64_t heldUs) {
  auto now = steadyMicros();
  lastHoldEndUs_ = now;
  auto who = actor.describe() + " in " + method;
  ++holds_.count;
  if (heldUs > holds_.longestUs) {
    holds_.longestUs = heldUs;
    holds_.longestBy = who;
  }
  if (trace::enabled()) {
    auto end = trace::now();
    // The method's name lives in its interface's method table for the whole process.
    trace::record(method.c_str(), "stall", trace::actorRow(actor.id), end - heldUs, end);
  }
  auto& w = holdWarnings_[std::to_string(actor.id) + "/" + method];
  if (w.atUs != 0 && now - w.atUs < 10'000'000) {
    ++w.since;
    return;
  }
  spdlog::warn(
      "{} held the event loop for {} ms: nothing else on this node ran meanwhile (its other "
      "actors, its calls and streams); move CPU-heavy work to offload(), or split it with "
      "co_await (--stall-warn-ms {}){}",
      who, heldUs / 1000, options_.stallWarnMs,
      w.since == 0 ? "" : " (" + std::to_string(w.since) + " more since its last warning)");
  w.atUs = now;
  w.since = 0;
}

void NodeRuntime::loopLate(kj::Duration late) {
  auto warnMs = options_.stallWarnMs;
  int64_t lateUs = late / kj::MICROSECONDS;
  if (warnMs == 0 || lateUs < int64_t(warnMs) * 1000) return;
  auto now = steadyMicros();
  // A method body's hold, already named, accounts for it.
  if (lastHoldEndUs_ != 0 && now - lastHoldEndUs_ <= lateUs + 50'000) return;
  std::string last = "no actor method has run yet";
  if (lastMethod_ != nullptr) {
    auto it = actors_.find(lastActorId_);
    last = "the last actor method to start was " + *lastMethod_ + " of " +
           (it == actors_.end() ? "actor #" + std::to_string(lastActorId_)
                                : it->second.address.describe()) +
           ", whose continuations (.then(), after co_await) may have held it";
  }
  auto& w = holdWarnings_[""];
  if (w.atUs != 0 && now - w.atUs < 10'000'000) {
    ++w.since;
    return;
  }
  spdlog::warn(
      "this node's event loop was held for {} ms outside any actor method's body; {} "
      "(--stall-warn-ms {}){}",
      lateUs / 1000, last, warnMs,
      w.since == 0 ? "" : " (" + std::to_string(w.since) + " more since the last warning)");
  w.atUs = now;
  w.since = 0;
}

void NodeRuntime::reportLoad(proto::NodeLoad::Builder load) {
  load.setHolds(holds_.count);
  load.setLongestHoldMs(uint32_t(holds_.longestUs / 1000));
  load.setLongestHoldBy(holds_.longestBy);
  holds_ = Holds{};
  auto cpu = cpu_.sample();
  load.setCpuPercent(cpu.percent);
  load.setIntervalMs(cpu.intervalMs);
  auto list = load.initActors(actors_.size());
  size_t i = 0;
  for (auto& [id, hosted] : actors_) {
    list[i].setId(id);
    list[i].setIncarnation(hosted.address.incarnation);
    list[i].setCalls(static_cast<uint32_t>(hosted.core->mailboxDepth()));
    ++i;
  }
}

void NodeRuntime::actorExited(uint64_t id, Exit reason) {
  auto it = actors_.find(id);
  if (it == actors_.end() || it->second.core->exited() || it->second.stopping) return;
  auto address = it->second.address;
  retire(id, reason);
  // The head logs the exit with what follows from it; here it is only a detail.
  spdlog::debug("actor {} exited: {}", address.describe(), reason.describe());
  auto req = cluster().actorExitedRequest();
  req.setId(id);
  req.setIncarnation(address.incarnation);
  reason.toProto(req.initReason());
  tasks_.add(req.send().ignoreResult());
}

std::string NodeRuntime::headActorsLine() const {
  if (headActors_.empty()) return "";
  std::string line = ", and with it ";
  for (size_t i = 0; i < headActors_.size(); ++i) {
    auto& a = headActors_[i];
    if (i > 0) line += ", ";
    line += a.name.empty() ? a.typeName + " #" + std::to_string(a.id)
                           : "'" + a.name + "' (" + a.typeName + " #" + std::to_string(a.id) + ")";
  }
  return line;
}

}  // namespace troupe
