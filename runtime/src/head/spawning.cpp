// The head: spawning. Spawn requests, placement by the scheduler, spawns and restarts that
// wait for capacity, gangs, resolve and lookup.

#include "head/head.h"

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "troupe/exit_codes.h"
#include "troupe/log.h"
#include "troupe/sched/decide.h"

namespace troupe {

// =======================================================================================
// SpawnRequest

SpawnRequest SpawnRequest::fromProto(proto::SpawnSpec::Reader spec) {
  SpawnRequest r;
  r.typeName = spec.getTypeName();
  r.name = spec.getName();
  r.args = kj::heapArray(spec.getArgs());
  auto parsed = Placement::parse(spec.getPlacement().cStr());
  if (!parsed) {
    kj::throwFatalException(KJ_EXCEPTION(FAILED, kj::str(parsed.error.c_str())));
  }
  r.placement = *parsed.value;
  r.parent = spec.getParent();
  r.link = spec.getLink();
  r.maxRestarts = spec.getMaxRestarts();
  r.restartWindow = spec.getRestartWindowMs() * kj::MILLISECONDS;
  r.stopTimeout = spec.getStopTimeoutMs() * kj::MILLISECONDS;
  r.maxConcurrency = spec.getMaxConcurrency();
  r.failCallOnly = spec.getFailCallOnly();
  if (spec.getCallDeadlineMs() > 0) r.callDeadline = spec.getCallDeadlineMs() * kj::MILLISECONDS;
  if (spec.getWaitForCapacityMs() > 0)
    r.waitForCapacity = spec.getWaitForCapacityMs() * kj::MILLISECONDS;
  r.index = spec.getIndex();
  r.count = spec.getCount();
  return r;
}

void SpawnRequest::toProto(proto::SpawnSpec::Builder spec) const {
  spec.setTypeName(typeName);
  spec.setName(name);
  spec.setArgs(args);
  spec.setPlacement(placement.toText());
  spec.setParent(parent);
  spec.setLink(link);
  spec.setMaxRestarts(maxRestarts);
  spec.setRestartWindowMs(restartWindow / kj::MILLISECONDS);
  spec.setStopTimeoutMs(stopTimeout / kj::MILLISECONDS);
  spec.setMaxConcurrency(maxConcurrency);
  spec.setFailCallOnly(failCallOnly);
  KJ_IF_MAYBE(d, callDeadline) {
    spec.setCallDeadlineMs(*d / kj::MILLISECONDS);
  }
  KJ_IF_MAYBE(w, waitForCapacity) {
    spec.setWaitForCapacityMs(*w / kj::MILLISECONDS);
  }
  spec.setIndex(index);
  spec.setCount(count);
}

// =======================================================================================
// Spawning

Head::ActorEntry* Head::findActor(uint64_t id) {
  auto it = actors_.find(id);
  return it == actors_.end() ? nullptr : &it->second;
}

Head::NodeEntry* Head::findNode(uint32_t id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

ActorAddress Head::addressFor(uint64_t id, uint32_t incarnation, uint32_t nodeId,
                              const SpawnRequest& spec) {
  auto& n = nodes_.at(nodeId);
  ActorAddress a;
  a.id = id;
  a.incarnation = incarnation;
  a.nodeId = nodeId;
  a.host = n.info.host().cStr();
  a.group = n.info.group().cStr();
  a.address = n.info.address().cStr();
  a.typeName = spec.typeName;
  a.name = spec.name;
  a.restartable = spec.maxRestarts > 0;
  return a;
}

void Head::checkSpawn(const SpawnRequest& request, bool many) {
  KJ_REQUIRE(!finishing_, "the job is ending; not starting more actors");
  if (!node_.registry().has(request.typeName)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED,
        kj::str("cannot spawn '", request.typeName,
                "': no actor type of that name is registered; registered types: ",
                node_.registry().names(), ". Register it in main() with Registry::add<T>(\"",
                request.typeName, "\")")));
  }
  if (request.parent != 0) {
    auto* parent = findActor(request.parent);
    KJ_REQUIRE(parent != nullptr && parent->state == State::RUNNING,
               "the parent of a new actor must be running", request.parent);
  }
  if (!request.name.empty() && names_.count(request.name)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("an actor named '", request.name, "' already exists; names are unique")));
  }
  KJ_REQUIRE(many || !request.placement.isMultiInstance(),
             "a multi-instance placement needs spawnMany()", request.placement.describe());
}

namespace {

// Why a decision placed nothing, and whether freed capacity (or a node joining) could change it.
std::string whyNot(const sched::ManyDecision& decision, bool& mayFitLater) {
  if (auto* u = std::get_if<sched::Unschedulable>(&decision)) {
    mayFitLater = u->fitsWhenFree;
    return u->reason;
  }
  if (auto* w = std::get_if<sched::Wait>(&decision)) {
    mayFitLater = true;
    return "not yet: " + w->reason;
  }
  mayFitLater = true;
  return "";
}

}  // namespace

kj::Array<ActorContext::Spawned> Head::spawn(SpawnRequest request, bool many) {
  checkSpawn(request, many);
  warnUnknownPreferences(request.placement);
  auto decision = sched::placeMany(view_, request.placement);
  if (auto* u = std::get_if<sched::Unschedulable>(&decision)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("cannot place '", request.typeName, "': ", u->reason.c_str())));
  }
  if (auto* w = std::get_if<sched::Wait>(&decision)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("cannot place '", request.typeName, "' yet: ", w->reason.c_str())));
  }
  return commit(request, std::get<sched::PlacedMany>(decision).nodeIds);
}

kj::Promise<kj::Array<ActorContext::Spawned>> Head::spawnWhenPlaced(SpawnRequest request,
                                                                    bool many) {
  checkSpawn(request, many);
  warnUnknownPreferences(request.placement);
  auto decision = sched::placeMany(view_, request.placement);
  if (auto* p = std::get_if<sched::PlacedMany>(&decision)) return commit(request, p->nodeIds);
  bool mayFitLater = false;
  auto why = whyNot(decision, mayFitLater);
  auto wait = request.waitForCapacity;
  if (wait == nullptr || !mayFitLater) {
    // At once, with the reason (no wait asked for, or it could never fit).
    return spawn(kj::mv(request), many);
  }
  auto ms = KJ_ASSERT_NONNULL(wait) / kj::MILLISECONDS;
  spdlog::info("'{}' does not fit now ({}); waiting up to {} ms for capacity", request.typeName,
               why, ms);
  auto paf = kj::newPromiseAndFulfiller<kj::Array<ActorContext::Spawned>>();
  auto serial = nextWaiting_++;
  waiting_.emplace(serial, Waiting{kj::mv(request), many, kj::mv(paf.fulfiller), why});
  tasks_.add(node_.loop().timer().afterDelay(KJ_ASSERT_NONNULL(wait)).then([this, serial, ms]() {
    auto it = waiting_.find(serial);
    if (it == waiting_.end()) return;
    auto& w = it->second;
    w.fulfiller->reject(
        KJ_EXCEPTION(OVERLOADED, kj::str("cannot place '", w.request.typeName, "' within ", ms,
                                         " ms (SpawnOptions::waitForCapacity): ", w.why.c_str())));
    waiting_.erase(it);
  }));
  return kj::mv(paf.promise);
}

void Head::capacityChanged() {
  // Retried once per turn, after whatever freed the capacity has finished. Restarts first: an
  // actor that ran before goes ahead of new spawns.
  if (retryScheduled_ || (waiting_.empty() && restartWaits_.empty())) return;
  retryScheduled_ = true;
  tasks_.add(kj::evalLater([this]() {
    retryScheduled_ = false;
    retryRestarts();
    retryWaiting();
  }));
}

void Head::retryWaiting() {
  // In request order; a later request that fits goes ahead of an earlier one that still does not.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto& w = it->second;
    if (!w.fulfiller->isWaiting()) {
      it = waiting_.erase(it);
      continue;
    }
    if (finishing_) {
      w.fulfiller->reject(KJ_EXCEPTION(
          FAILED, kj::str("cannot place '", w.request.typeName, "': the job is ending")));
      it = waiting_.erase(it);
      continue;
    }
    auto decision = sched::placeMany(view_, w.request.placement);
    if (auto* p = std::get_if<sched::PlacedMany>(&decision)) {
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                    // The parent may have exited, or the name been taken, meanwhile.
                    checkSpawn(w.request, w.many);
                    w.fulfiller->fulfill(commit(w.request, p->nodeIds));
                  })) {
        w.fulfiller->reject(kj::mv(*e));
      }
      it = waiting_.erase(it);
      continue;
    }
    bool mayFitLater = false;
    w.why = whyNot(decision, mayFitLater);
    ++it;
  }
}

kj::Array<ActorContext::Spawned> Head::spawnGang(kj::Array<SpawnRequest> members) {
  std::vector<Placement> placements;
  for (auto& m : members) {
    checkSpawn(m, false);
    warnUnknownPreferences(m.placement);
    placements.push_back(m.placement);
  }
  auto decision = sched::gang(view_, placements);
  bool mayFitLater = false;
  auto why = whyNot(decision, mayFitLater);
  if (!why.empty()) {
    kj::throwFatalException(
        KJ_EXCEPTION(FAILED, kj::str("cannot place the gang of ", members.size(),
                                     " (none was started): ", why.c_str())));
  }
  auto& nodeIds = std::get<sched::PlacedMany>(decision).nodeIds;
  KJ_ASSERT(nodeIds.size() == members.size());
  auto out = kj::heapArrayBuilder<ActorContext::Spawned>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    std::vector<uint32_t> one = {nodeIds[i]};
    auto spawned = commit(members[i], one);
    out.add(kj::mv(spawned[0]));
  }
  return out.finish();
}

kj::Array<ActorContext::Spawned> Head::commit(SpawnRequest& request,
                                              const std::vector<uint32_t>& placed) {
  auto out = kj::heapArrayBuilder<ActorContext::Spawned>(placed.size());
  size_t index = 0;
  for (auto nodeId : placed) {
    uint64_t id = nextActorId_++;
    SpawnRequest spec;
    spec.typeName = request.typeName;
    spec.name = request.name.empty() || placed.size() == 1
                    ? request.name
                    : request.name + "-" + std::to_string(index);
    spec.args = kj::heapArray(request.args.asPtr());
    spec.placement = request.placement;
    spec.parent = request.parent;
    spec.link = request.link;
    spec.maxRestarts = request.maxRestarts;
    spec.restartWindow = request.restartWindow;
    spec.stopTimeout = request.stopTimeout;
    spec.maxConcurrency = request.maxConcurrency;
    spec.failCallOnly = request.failCallOnly;
    spec.callDeadline = request.callDeadline;
    spec.waitForCapacity = request.waitForCapacity;
    spec.quiet = request.quiet;
    spec.index = index;
    spec.count = placed.size();
    ++index;

    KJ_ASSERT(view_.reserve(nodeId, spec.placement.getResources()), "scheduler overcommitted");
    ActorEntry entry;
    entry.address = addressFor(id, 1, nodeId, spec);
    entry.reserved = true;
    if (spec.link) {
      entry.links.insert(spec.parent);
      if (spec.parent != 0) actors_.at(spec.parent).links.insert(id);
    }
    if (!spec.name.empty()) names_[spec.name] = id;
    if (spec.parent == 0) {
      rootChildren_.push_back(id);
    } else {
      actors_.at(spec.parent).children.push_back(id);
    }
    entry.spec = kj::mv(spec);
    auto& stored = actors_.emplace(id, kj::mv(entry)).first->second;
    hostOn(stored);
    out.add(ActorContext::Spawned{stored.client, stored.address});
  }
  return out.finish();
}

void Head::warnUnknownPreferences(const Placement& placement) {
  // A preference for a group this cluster lacks is how one app runs on a homogeneous cluster,
  // so it is not an error; but it may be a typo, so say so once per name.
  for (auto& group : placement.getPreferred()) {
    if (view_.hasGroup(group) || !warnedPreferences_.insert(group).second) continue;
    auto known = view_.getGroupNames();
    spdlog::warn(
        "preferred group '{}' is not in this cluster (groups: {}); actors that prefer it "
        "go wherever else they fit",
        group, fmt::join(known, ", "));
  }
}

void Head::hostOn(ActorEntry& entry) {
  auto& n = nodes_.at(entry.address.nodeId);
  auto req = n.client.hostRequest();
  entry.spec.toProto(req.initSpec());
  ++hosted_;
  hostedArgBytes_ += entry.spec.args.size();
  entry.address.toProto(req.initAddress());
  auto response = req.send();
  entry.client = response.getActor();
  auto id = entry.address.id;
  auto incarnation = entry.address.incarnation;
  auto description = entry.address.describe();
  if (entry.spec.quiet) {
    spdlog::debug("started {}", description);
  } else {
    spdlog::info("started {}", description);
  }
  entry.started =
      response.ignoreResult()
          .catch_([this, id, incarnation, description](kj::Exception&& e) {
            actorExited(id, incarnation,
                        Exit::failed(std::string("could not start: ") + e.getDescription().cStr()));
            kj::throwFatalException(kj::mv(e));
          })
          .fork();
  KJ_IF_MAYBE(s, entry.started) {
    tasks_.add(s->addBranch());
  }
  if (entry.address.nodeId == 1) announceHeadActors();
}

void Head::announceHeadActors() {
  std::vector<const ActorEntry*> mine;
  for (auto& [id, a] : actors_) {
    if (a.address.nodeId == 1 && a.state != State::DEAD) mine.push_back(&a);
  }
  for (auto& [id, n] : nodes_) {
    if (id == 1 || !n.alive) continue;
    auto req = n.client.headActorsRequest();
    auto list = req.initActors(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) mine[i]->address.toProto(list[i]);
    tasks_.add(req.send().ignoreResult());
  }
}

kj::Promise<void> Head::whenPlaced(uint64_t id) {
  auto* e = findActor(id);
  if (e == nullptr || e->state != State::RESTARTING) return kj::READY_NOW;
  return whenStarted(id).catch_([](kj::Exception&&) {});
}

kj::Promise<void> Head::whenStarted(uint64_t id) {
  auto* e = findActor(id);
  if (e == nullptr) return kj::READY_NOW;
  KJ_IF_MAYBE(s, e->started) {
    return s->addBranch();
  }
  return kj::READY_NOW;
}

kj::Maybe<ActorAddress> Head::resolve(uint64_t id) {
  auto* e = findActor(id);
  if (e == nullptr || e->state == State::DEAD) return nullptr;
  return e->address;
}

kj::Maybe<const Exit&> Head::exitOf(uint64_t id) const {
  auto it = tombstones_.find(id);
  if (it == tombstones_.end()) return nullptr;
  return it->second;
}

kj::Maybe<ActorAddress> Head::lookup(kj::StringPtr name) {
  auto it = names_.find(name.cStr());
  if (it == names_.end()) return nullptr;
  return resolve(it->second);
}

std::vector<NodeInfo> Head::nodes() const {
  std::vector<NodeInfo> out;
  for (auto& [id, n] : nodes_) {
    if (n.alive) out.push_back(n.info);
  }
  std::sort(out.begin(), out.end(),
            [](auto& a, auto& b) { return strcmp(a.host().cStr(), b.host().cStr()) < 0; });
  return out;
}

proto::Node::Client Head::nodeAt(const std::string& address,
                                 kj::Maybe<proto::Node::Client> otherwise) {
  for (auto& [id, n] : nodes_) {
    if (n.alive && address == n.info.address().cStr()) return n.client;
  }
  KJ_IF_MAYBE(o, otherwise) {
    return *o;
  }
  return KJ_EXCEPTION(DISCONNECTED, kj::str("no live node listens at ", address.c_str()));
}

}  // namespace troupe
