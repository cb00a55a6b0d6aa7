#include "head/head.h"

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "troupe/log.h"

#include <algorithm>

#include "trace/trace_collect.h"
#include "troupe/exit_codes.h"
#include "troupe/node_size.h"
#include "troupe/sched/decide.h"

namespace troupe {

namespace {

sched::Resources capacityOf(const NodeInfo& info) {
  auto capacity = sched::Resources::of(info.vcpus(), info.gpus(), info.memoryBytes());
  for (auto& [name, amount] : info.resources()) capacity.withCustom(name, amount);
  return capacity;
}

// "4 vcpus, 1 gpus, labels zone=a, resources fpga=2": what a node brings, for the join line.
std::string describeNode(const NodeInfo& info) {
  auto text = std::to_string(info.vcpus()) + " vcpus, " + std::to_string(info.gpus()) + " gpus";
  if (!info.labels().empty()) text += ", labels " + formatLabels(info.labels());
  if (!info.resources().empty()) text += ", resources " + formatResources(info.resources());
  return text;
}

std::string nodeLine(const NodeInfo& info) {
  return std::string(info.host().cStr()) + " (" + info.group().cStr() + ")";
}

}  // namespace

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
// Head: formation

Head::Head(NodeRuntime& node, DriverFunction driver, std::vector<std::string> appArgs)
    : node_(node),
      startedAt_(node.loop().timer().now()),
      driverFn_(kj::mv(driver)),
      tasks_(*this),
      finished_(nullptr) {
  driver_ = kj::heap<Driver>(*this, kj::mv(appArgs));
  auto paf = kj::newPromiseAndFulfiller<void>();
  finishFulfiller_ = kj::mv(paf.fulfiller);
  finished_ = paf.promise.fork();
  for (auto& g : node_.config().groups) {
    for (auto& h : g.hosts) {
      if (h != node_.config().currentHost) view_.expectHost({h, g.name, g.instanceType});
    }
  }
}

Head::~Head() noexcept(false) {}

void Head::taskFailed(kj::Exception&& exception) {
  spdlog::debug("head task failed: {}", exception.getDescription().cStr());
}

uint32_t Head::join(const NodeInfo& info, proto::Node::Client client) {
  std::string host = info.host().cStr();
  auto& config = node_.config();
  if (!std::binary_search(config.hosts.begin(), config.hosts.end(), host)) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("host '", host, "' is not in the cluster description ", config.source,
                        "; every instance must be started with the same cluster file")));
  }
  auto& group = config.groupOf(host);
  if (group.name != info.group().cStr()) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("host '", host, "' says it is in group '", info.group(), "' but ",
                        config.source, " puts it in '", group.name.c_str(), "'")));
  }
  if (view_.findHost(host) != nullptr) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("host '", host, "' has already joined; two processes claim to be it")));
  }
  uint32_t id = nextNodeId_++;
  sched::NodeSpec spec;
  spec.id = id;
  spec.host = host;
  spec.group = info.group().cStr();
  spec.instanceType = info.instanceType().cStr();
  spec.capacity = capacityOf(info);
  for (auto& [key, value] : info.labels()) spec.labels[key] = value;
  view_.addNode(spec, sched::NodeState::ALIVE);
  nodes_.emplace(id, NodeEntry{id, info, kj::mv(client), true, node_.loop().timer().now()});
  if (id != 1) {
    spdlog::info("{} joined from {} ({}); {} still expected", nodeLine(info), info.address(),
                 describeNode(info), view_.getExpectedHosts().size());
  }
  if (view_.getExpectedHosts().empty() && formed_.get() != nullptr) formed_->fulfill();
  capacityChanged();
  return id;
}

void Head::watchConnection(uint32_t nodeId, kj::Promise<void> disconnected) {
  tasks_.add(disconnected
                 .then([]() { return std::string("its connection closed"); },
                       [](kj::Exception&& e) {
                         return std::string("its connection failed: ") + e.getDescription().cStr();
                       })
                 .then([this, nodeId](std::string why) { nodeLost(nodeId, why); }));
}

kj::Maybe<std::string> Head::heartbeat(uint32_t nodeId, proto::NodeLoad::Reader load) {
  auto* n = findNode(nodeId);
  if (n == nullptr) return std::string("node id " + std::to_string(nodeId) + " is unknown");
  if (!n->alive) return n->lostBecause;
  n->lastHeartbeat = node_.loop().timer().now();
  recordLoad(*n, load);
  return nullptr;
}

void Head::recordLoad(NodeEntry& node, proto::NodeLoad::Reader load) {
  auto& l = node.load;
  l.cpuPercent = load.getCpuPercent();
  l.intervalMs = load.getIntervalMs();
  l.calls.clear();
  for (auto a : load.getActors()) l.calls[a.getId()] = {a.getIncarnation(), a.getCalls()};
  l.at = node_.loop().timer().now();
}

void Head::recordOwnLoad() {
  capnp::MallocMessageBuilder message(256);
  auto load = message.initRoot<proto::NodeLoad>();
  node_.reportLoad(load);
  recordLoad(nodes_.at(1), load.asReader());
}

kj::Promise<void> Head::formCluster() {
  // The head is a node too: it joins its own directory first.
  join(node_.info(), node_.selfClient());
  if (view_.getExpectedHosts().empty()) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  formed_ = kj::mv(paf.fulfiller);
  auto timeout = node_.options().joinTimeoutMs * kj::MILLISECONDS;
  return paf.promise.exclusiveJoin(node_.loop().timer().afterDelay(timeout).then([this]() {
    std::string missing;
    for (auto& h : view_.getExpectedHosts()) {
      if (!missing.empty()) missing += ", ";
      missing += h.host + " (" + h.group + ")";
    }
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("the cluster did not form within ", node_.options().joinTimeoutMs,
                        " ms: still missing ", missing.c_str(),
                        "; check that they started with the same cluster file and token and can "
                        "reach ",
                        node_.info().address())));
  }));
}

kj::Promise<void> Head::checkHeartbeats(kj::TimePoint due) {
  auto interval = node_.options().heartbeatMs * kj::MILLISECONDS;
  return node_.loop().timer().atTime(due).then([this, due, interval]() {
    auto now = node_.loop().timer().now();
    // However late this check runs is the head's own stall (frozen, or starved of CPU), not its
    // workers' silence: their heartbeats may be waiting unread in its sockets. Credit it to every
    // node before judging, so only silence the head was awake for counts.
    auto stall = now - due;
    for (auto& [id, n] : nodes_) n.lastHeartbeat = kj::min(now, n.lastHeartbeat + stall);
    if (stall > interval) {
      spdlog::warn("the head's event loop stalled for {} ms; not counted against the workers",
                   stall / kj::MILLISECONDS);
    }
    auto limit = node_.options().nodeTimeoutMs * kj::MILLISECONDS;
    std::vector<uint32_t> silent;
    for (auto& [id, n] : nodes_) {
      if (id != 1 && n.alive && now - n.lastHeartbeat > limit) silent.push_back(id);
    }
    for (auto id : silent) {
      nodeLost(id, kj::str("no heartbeat for ", node_.options().nodeTimeoutMs, " ms").cStr());
    }
    recordOwnLoad();  // the head's own load, on its workers' schedule
    return checkHeartbeats(now + interval);
  });
}

void Head::signalled(const char* signal) {
  if (signalled_) {
    node_.requestExit(INTERRUPTED, std::string("second ") + signal + "; not waiting any longer");
    return;
  }
  signalled_ = true;
  if (finishing_) {
    spdlog::warn("{} on the head: the job is already ending; a second one ends it at once", signal);
  }
  finish(INTERRUPTED, std::string(signal) + " on " + nodeLine(node_.info()) + " (the head)");
}

kj::Promise<void> Head::run() {
  // A second signal *to this process* cuts the cascade short; a job already ending for another
  // reason (a worker's SIGTERM reached the head first, as when SageMaker stops every instance at
  // once) is not a first one: the cascade goes on, the trainer's checkpoint included.
  node_.loop().onSignal(SIGTERM, [this](int) { signalled("SIGTERM"); });
  node_.loop().onSignal(SIGINT, [this](int) { signalled("SIGINT"); });
  spdlog::info("head of {} hosts in groups {}; waiting for {} to join", node_.config().hosts.size(),
               node_.config().groupNames(), view_.getExpectedHosts().size());
  tasks_.add(formCluster().then(
      [this]() {
        auto interval = node_.options().heartbeatMs * kj::MILLISECONDS;
        tasks_.add(checkHeartbeats(node_.loop().timer().now() + interval));
        if (!finishing_) startDriver();
      },
      [this](kj::Exception&& e) { finish(JOIN_FAILED, e.getDescription().cStr()); }));
  return finished_.addBranch();
}

void Head::startDriver() {
  spdlog::info("cluster formed: {} nodes; starting the driver", nodes_.size());
  driverRunning_ = true;
  driverTask_ = kj::evalLater([this]() { return driverFn_(*driver_); })
                    .then([this]() { finish(OK, "the driver finished"); },
                          [this](kj::Exception&& e) {
                            finish(JOB_FAILED,
                                   std::string("the driver failed: ") + e.getDescription().cStr());
                          })
                    .eagerlyEvaluate(nullptr);
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
  entry.address.toProto(req.initAddress());
  auto response = req.send();
  entry.client = response.getActor();
  auto id = entry.address.id;
  auto incarnation = entry.address.incarnation;
  auto description = entry.address.describe();
  spdlog::info("started {}", description);
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
  view_.setState(nodeId, sched::NodeState::LOST);
  if (finishing_) {
    spdlog::debug("{} left: {}", nodeLine(n->info), why);
    return;
  }
  spdlog::error("node {} was lost: {}", nodeLine(n->info), why);
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
  for (auto& [id, n] : nodes_) {
    if (id == 1 || !n.alive) continue;
    auto req = n.client.peerLostRequest();
    req.setHost(host);
    req.setAddress(address);
    req.setReason(why);
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
                 .then([this, host, address, why]() { node_.fencePeer(host, address, why); }));
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
    spdlog::warn("{} exited: {}", entry.address.describe(), reason.describe());
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

// =======================================================================================
// The end of the job

void Head::finish(int code, std::string reason) {
  if (finishing_) return;
  finishing_ = true;
  code_ = code;
  reason_ = reason;
  if (code == OK) {
    spdlog::info("job finished: {}", reason);
  } else {
    // The one line that says what failed, where, and why.
    spdlog::error("job failed ({}): {}", exitCodeName(code), reason);
  }
  tasks_.add(kj::evalLater([this]() {
    // Cancel the driver (outside of its own continuation).
    driverTask_ = nullptr;
    return endJob();
  }));
}

kj::Promise<void> Head::endJob() {
  // 1. The cascade: stop the driver's actors, newest first, each with its subtree.
  std::vector<uint64_t> roots(rootChildren_.rbegin(), rootChildren_.rend());
  kj::Promise<void> chain = kj::READY_NOW;
  for (auto id : roots) {
    chain = chain.then(
        [this, id]() { return terminate(id, Exit::shutdown("the job is ending"), false, false); });
  }
  // 2. With --trace, the spans of every node, while they all still run (troupe/trace.h).
  // 3. Every other node stops what it still hosts and exits with the job's status.
  return chain.then([this]() { return collectTrace(); })
      .then([this]() {
        auto exits = kj::heapArrayBuilder<kj::Promise<void>>(nodes_.size());
        for (auto& [id, n] : nodes_) {
          if (id == 1 || !n.alive) continue;
          auto req = n.client.exitRequest();
          req.setStatus(code_);
          req.setReason(reason_);
          exits.add(node_.loop()
                        .timer()
                        .timeoutAfter(5 * kj::SECONDS, req.send().ignoreResult())
                        .catch_([](kj::Exception&&) {}));
        }
        return kj::joinPromises(exits.finish());
      })
      // 4. The head exits last.
      .then([this]() { return node_.stopAll(Exit::shutdown("the job is ending")); })
      .then([this]() {
        node_.requestExit(code_, reason_);
        finishFulfiller_->fulfill();
      });
}

kj::Promise<void> Head::collectTrace() {
  auto& path = node_.options().traceFile;
  if (path.empty()) return kj::READY_NOW;
  auto collector = kj::heap<TraceCollector>(node_.loop().timer(), path);
  auto reads = kj::heapArrayBuilder<kj::Promise<void>>(nodes_.size());
  std::set<std::string> joined;
  for (auto& [id, n] : nodes_) {
    std::string host = n.info.host().cStr(), group = n.info.group().cStr();
    joined.insert(host);
    if (id == 1) {
      collector->addHead(host, group, id);
    } else if (!n.alive) {
      collector->addMissing(host, group, "lost before the end of the job: " + n.lostBecause);
    } else {
      reads.add(collector->collect(host, group, id, n.client));
    }
  }
  for (auto& g : node_.config().groups) {
    for (auto& h : g.hosts) {
      if (!joined.count(h)) collector->addMissing(h, g.name, "never joined the cluster");
    }
  }
  auto& c = *collector;
  return kj::joinPromises(reads.finish())
      .then([&c]() { c.write(); })
      .catch_([](kj::Exception&& e) {
        spdlog::error("trace: not written: {}", e.getDescription().cStr());
      })
      .attach(kj::mv(collector));
}

// =======================================================================================
// ClusterSession

kj::Promise<void> ClusterSession::join(JoinContext call) {
  auto p = call.getParams();
  auto id = head_.join(NodeInfo::fromProto(p.getInfo()), p.getNode());
  KJ_IF_MAYBE(c, connection_) {
    head_.watchConnection(id, c->onDisconnect());
  }
  auto r = call.getResults();
  r.setNodeId(id);
  r.setHeartbeatMs(head_.node().options().heartbeatMs);
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

}  // namespace troupe
