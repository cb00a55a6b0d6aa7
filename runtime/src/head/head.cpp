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
  if (id != 1 && control_) control_->admit(id, host);
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
