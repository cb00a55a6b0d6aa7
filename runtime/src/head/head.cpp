// The head: formation (nodes join, are counted and lost), the driver's start, signals. The
// other parts of the head: spawning.cpp, lifecycle.cpp, job_end.cpp, cluster_session.cpp,
// head_status.cpp.
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

}  // namespace

std::map<std::string, unsigned> parseStartWith(const std::vector<std::string>& items,
                                               const ClusterConfig& config) {
  std::map<std::string, unsigned> out;
  for (auto& item : items) {
    auto eq = item.find('=');
    auto name = item.substr(0, eq);
    auto count = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    const InstanceGroup* group = config.findGroup(name);
    if (eq == std::string::npos || name.empty()) {
      throw ConfigError("--start-with '" + item + "': expected GROUP=N, e.g. data_group=1");
    }
    if (group == nullptr) {
      throw ConfigError("--start-with '" + item + "': the cluster has no group '" + name +
                        "'; its groups are " + config.groupNames());
    }
    size_t used = 0;
    unsigned long n = 0;
    try {
      n = std::stoul(count, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != count.size() || n > group->hosts.size()) {
      throw ConfigError("--start-with '" + item + "': N must be a number from 0 to " +
                        std::to_string(group->hosts.size()) + " (the hosts of group '" + name +
                        "')");
    }
    out[name] = static_cast<unsigned>(n);
  }
  return out;
}

std::string nodeLine(const NodeInfo& info) {
  return std::string(info.host().cStr()) + " (" + info.group().cStr() + ")";
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
  startWith_ = parseStartWith(node_.options().startWith, node_.config());
}

Head::~Head() noexcept(false) {}

void Head::taskFailed(kj::Exception&& exception) {
  spdlog::debug("head task failed: {}", exception.getDescription().cStr());
}

uint32_t Head::join(const NodeInfo& info, proto::Node::Client client) {
  std::string host = info.host().cStr();
  auto& config = node_.config();
  bool member = std::binary_search(config.hosts.begin(), config.hosts.end(), host);
  if (!member && config.findGroup(info.group().cStr()) == nullptr) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("host '", host, "' is not in the cluster description ", config.source,
                        " and its group '", info.group(), "' is not one of the job's (",
                        config.groupNames().c_str(),
                        "); a new member must join one of them, with the job's secret")));
  }
  if (!member) {
    // A scale-up (a Kubernetes replica, a second Slurm job): a host the description does not
    // name joins a group it does name, with the job's secret (TLS proved it).
    membershipEvent(std::string(host) + " (" + info.group().cStr() +
                    ") is a new member of its group (not in " + config.source + ")");
  }
  auto& group = member ? config.groupOf(host) : *config.findGroup(info.group().cStr());
  if (group.name != info.group().cStr()) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("host '", host, "' says it is in group '", info.group(), "' but ",
                        config.source, " puts it in '", group.name.c_str(), "'")));
  }
  if (finishing_) {
    kj::throwFatalException(
        KJ_EXCEPTION(FAILED, kj::str("host '", host, "' ", kJobEnding, exitCodeName(code_), ": ",
                                     reason_.c_str(), ")")));
  }
  // A host seen before: a process started again in place of a lost one (kill -9, a crash, a
  // partition that healed) rejoins as a new node; one that claims a host whose process is alive
  // must be a newer incarnation of it, which replaces that process.
  bool rejoined = false;
  if (auto* old = view_.findHost(host)) {
    auto& previous = nodes_.at(old->id);
    auto incarnation = info.incarnation(), before = previous.info.incarnation();
    if (old->id == 1 || (previous.alive && incarnation <= before)) {
      kj::throwFatalException(KJ_EXCEPTION(
          FAILED,
          kj::str("host '", host, "' has already joined (incarnation ", before, "); ",
                  kTwoProcesses, ". A process started in place of another must "
                  "have a higher incarnation (TROUPE_INCARNATION ",
                  before + 1,
                  " or more); this "
                  "one has ",
                  incarnation)));
    }
    if (previous.alive) {
      nodeLost(old->id, "replaced by incarnation " + std::to_string(incarnation) +
                            " of the same host (its process was started again)");
    }
    view_.removeNode(old->id);  // its books are settled: the actors it hosted were moved on
    rejoined = true;
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
  if (id != 1 && control_) control_->admit(id, host);
  if (id != 1 && !driverRunning_) {
    spdlog::info("{} joined from {} ({}); {} still expected", nodeLine(info), info.address(),
                 describeNode(info), view_.getExpectedHosts().size());
  } else if (id != 1) {
    membershipEvent(nodeLine(info) +
                    (rejoined ? " rejoined (incarnation " + std::to_string(info.incarnation()) + ")"
                              : " joined the running job") +
                    " from " + info.address().cStr() + " (" + describeNode(info) + ")");
  }
  if (formed_.get() != nullptr && formedEnough()) {
    formed_->fulfill();
    formed_ = nullptr;
  }
  capacityChanged();
  if (driverRunning_ && id != 1) {
    // After this turn, which sends the join's answer: the node then knows the cluster before it
    // is asked to host anything.
    tasks_.add(kj::evalLater([this, id]() {
      auto* n = findNode(id);
      if (n == nullptr || !n->alive || finishing_) return;
      auto info = n->info;
      for (auto& callback : joinedCallbacks_) callback(info);
    }));
  }
  return id;
}

bool Head::formedEnough() const {
  for (auto& g : node_.config().groups) {
    auto it = startWith_.find(g.name);
    size_t need = it == startWith_.end() ? g.hosts.size() : it->second;
    // Hosts that joined: one lost since counts (the job starts without it, as a later loss
    // would leave it), one that came back is one host.
    std::set<std::string> joined;  // of the hosts the description names
    for (auto& [id, n] : nodes_) {
      std::string host = n.info.host().cStr();
      if (std::binary_search(g.hosts.begin(), g.hosts.end(), host)) joined.insert(host);
    }
    if (joined.size() < need) return false;
  }
  return true;
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
  l.holds += load.getHolds();
  if (load.getHolds() > 0 && load.getLongestHoldMs() >= l.longestHoldMs) {
    l.longestHoldMs = load.getLongestHoldMs();
    l.longestHoldBy = load.getLongestHoldBy();
  }
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
  if (formedEnough()) return kj::READY_NOW;
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
  // Liveness is judged on the control thread (control/control.h), which no actor method or bulk
  // message can hold up; this loop only acts on its verdicts, whenever it gets to run.
  auto interval = node_.options().heartbeatMs * kj::MILLISECONDS;
  return node_.loop().timer().atTime(due).then([this, due, interval]() {
    auto now = node_.loop().timer().now();
    auto stall = now - due;
    node_.loopLate(stall);
    if (control_) {
      for (auto& lost : control_->takeLost()) nodeLost(lost.nodeId, lost.why);
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
  {
    // The control path listens where the node does: on its address, or on every interface when
    // the host map gives it none.
    std::string address = node_.info().address().cStr();
    auto colon = address.rfind(':');
    std::string host = node_.hosts().addresses.count(node_.config().currentHost) == 0
                           ? "*"
                           : address.substr(0, colon);
    control_ = std::make_unique<ControlServer>(ControlSettings::from(node_.options(), node_.tls()), host,
                                               node_.options().controlPort);
    spdlog::info("control path listening on port {}", control_->port());
  }
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
  size_t alive = 0;
  for (auto& [id, n] : nodes_) alive += n.alive ? 1 : 0;
  if (alive == nodes_.size()) {
    spdlog::info("cluster formed: {} nodes; starting the driver", alive);
  } else {
    spdlog::warn("cluster formed: {} nodes ({} of {} that joined were lost); starting the driver",
                 alive, nodes_.size() - alive, nodes_.size());
  }
  if (!view_.getExpectedHosts().empty()) {
    // --start-with: the others join the running job when they come up. Placements no longer
    // wait for them; a multi-instance spawn gets actors on them when they do (onNodeJoined).
    std::string late;
    for (auto& h : view_.getExpectedHosts()) {
      late += (late.empty() ? "" : ", ") + h.host + " (" + h.group + ")";
    }
    spdlog::info(
        "starting without {} (--start-with): they join the running job when they come "
        "up",
        late);
    view_.forgetAllExpected();
  }
  driverRunning_ = true;
  driverTask_ = kj::evalLater([this]() { return driverFn_(*driver_); })
                    .then([this]() { finish(OK, "the driver finished"); },
                          [this](kj::Exception&& e) {
                            finish(JOB_FAILED,
                                   std::string("the driver failed: ") + e.getDescription().cStr());
                          })
                    .eagerlyEvaluate(nullptr);
}

}  // namespace troupe
