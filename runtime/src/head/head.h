// The head: the cluster directory (nodes, groups, actors), the scheduler's books, the actor
// lifecycle state machine (tree, links, monitors, restarts) and the job's end. Private to the
// runtime; reached over RPC through ClusterSession and locally through Driver. Its code is split
// by part: head.cpp (formation, joins), spawning.cpp, lifecycle.cpp, membership.cpp (drains,
// nodes joining the running job), job_end.cpp, cluster_session.cpp and head_status.cpp.

#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "control/control.h"
#include "node/node.h"
#include "actor/spawn_request.h"
#include "troupe/driver.h"
#include "troupe/sched/cluster_view.h"

namespace troupe {

std::string nodeLine(const NodeInfo& info);
// "algo-2 (data_group)": a node as the head's log lines name it.

std::map<std::string, unsigned> parseStartWith(const std::vector<std::string>& items,
                                               const ClusterConfig& config);
// --start-with GROUP=N items, checked against the cluster description: group -> N. Throws
// ConfigError naming the item. Every node checks them, so a bad one fails every instance at once.

// kDrainWindowMs, kTwoProcesses and kJobEnding, which a worker reads too: node/head_link.h.

class Head final : public HeadLink, private kj::TaskSet::ErrorHandler {
 public:
  Head(NodeRuntime& node, DriverFunction driver, std::vector<std::string> appArgs);
  ~Head() noexcept(false);

  kj::Promise<void> run();
  // Forms the cluster, runs the driver and ends the job; resolves when every node has been told
  // to exit (node().exitCode() is then the job's status).
  void signalled(const char* signal);
  // SIGTERM or SIGINT on the head: end the job (INTERRUPTED); a second one exits at once.

  NodeRuntime& node() { return node_; }
  uint16_t controlPort() const { return control_ ? control_->port() : 0; }
  void stopControl() { control_.reset(); }
  // Ends the control thread (the process is about to exit).
  // Where the head's control thread listens (docs/lifecycle.md, "The control path").

  // -- Cluster (called by ClusterSession and Driver) --
  uint32_t join(const NodeInfo& info, proto::Node::Client client);
  void watchConnection(uint32_t nodeId, kj::Promise<void> disconnected);
  kj::Maybe<std::string> heartbeat(uint32_t nodeId, proto::NodeLoad::Reader load);
  // Records a heartbeat and the load it carries; returns why the node was fenced if the head has
  // declared it lost.
  kj::Array<ActorContext::Spawned> spawn(SpawnRequest request, bool many);
  // Places and starts now, or throws with the reason.
  kj::Promise<kj::Array<ActorContext::Spawned>> spawnWhenPlaced(SpawnRequest request, bool many);
  // The same, but a request with waitForCapacity that does not fit now (and could once capacity
  // frees up or an expected node joins) waits up to that long, retried whenever capacity changes;
  // past it, fails OVERLOADED with the last reason.
  kj::Array<ActorContext::Spawned> spawnGang(kj::Array<SpawnRequest> members);
  // All members placed together (sched::gang), or none and a throw with the reason.
  kj::Promise<void> whenStarted(uint64_t id);
  kj::Promise<void> whenPlaced(uint64_t id);
  // Resolves at once, or, for an actor whose restart waits for capacity, once it is placed or has
  // ended (never fails).
  kj::Maybe<ActorAddress> resolve(uint64_t id);
  kj::Maybe<const Exit&> exitOf(uint64_t id) const;
  // Why an actor that is gone exited.
  kj::Maybe<ActorAddress> lookup(kj::StringPtr name);
  void actorExited(uint64_t id, uint32_t incarnation, Exit reason);
  void link(uint64_t a, uint64_t b);
  void monitor(uint64_t target, proto::Watcher::Client watcher);
  kj::Promise<void> stop(uint64_t id);
  void finish(int code, std::string reason);
  void leave(uint32_t nodeId, std::string reason);
  // A worker was signalled (Cluster.leave): a drain after kDrainWindowMs, unless the job is
  // ending by then.
  void onNodeJoined(kj::Function<void(const NodeInfo&)> callback);
  // Called for every node that joins once the driver runs: a late host, a scale-up, a process
  // started again in place of a lost one (Driver::onNodeJoined).
  void onJobEnd(kj::Function<void(const JobEnd&)> callback);
  // Called once as the job ends, after the cascade (Driver::onJobEnd).
  std::vector<NodeInfo> nodes() const;
  const std::vector<std::string>& membershipChanges() const { return membership_; }
  // -- HeadLink (what the node this head runs on asks of it) --
  proto::Cluster::Client session(kj::Maybe<Connection&> connection) override;
  proto::Node::Client nodeAt(const std::string& address,
                             kj::Maybe<proto::Node::Client> otherwise) override;
  void status(proto::JobStatus::Builder out) const override;
  // The job as the head sees it, for `troupe status` (head_status.cpp): nodes with their last
  // heartbeat and load, groups, and every actor with its state and mailbox depth.

 private:
  struct NodeEntry {
    uint32_t id;
    NodeInfo info;
    proto::Node::Client client;
    bool alive = true;
    kj::TimePoint lastHeartbeat;
    std::string lostBecause;  // set when declared lost
    bool draining = false;    // leave(): its actors are moving elsewhere; it takes no new ones
    bool left = false;        // drained and told to exit 0 (not alive, not lost)
    struct Load {
      // From the node's last heartbeat (the head's own: its heartbeat check).
      float cpuPercent = 0;
      uint32_t intervalMs = 0;
      std::map<uint64_t, std::pair<uint32_t, uint32_t>> calls;  // id -> incarnation, calls
      kj::Maybe<kj::TimePoint> at;
      // Over the whole job: method bodies that held its event loop past --stall-warn-ms.
      uint32_t holds = 0;
      uint32_t longestHoldMs = 0;
      std::string longestHoldBy;
    } load;
  };
  // RESTARTING: its last incarnation is gone and its restart waits for capacity (SpawnOptions::
  // waitForCapacity); calls that resolve it wait too.
  enum class State { RUNNING, STOPPING, RESTARTING, DEAD };
  struct ActorEntry {
    ActorAddress address;
    SpawnRequest spec;
    std::vector<uint64_t> children;  // start order
    std::set<uint64_t> links;        // 0 = the driver
    std::vector<proto::Watcher::Client> watchers;
    std::deque<kj::TimePoint> restarts;
    State state = State::RUNNING;
    bool reserved = false;
    proto::Actor::Client client = nullptr;
    kj::Maybe<kj::ForkedPromise<void>> started;
  };

  struct RestartWait {
    // A restart that did not fit: placed when capacity frees up, else the actor ends at the
    // deadline with `reason` and why it did not fit.
    Exit reason;
    std::string why;  // the latest reason it did not fit
    kj::Own<kj::PromiseFulfiller<void>> placed;  // resolves entry.started's stand-in
    uint64_t serial;  // this wait's, against a stale deadline
  };

  struct Waiting {
    SpawnRequest request;
    bool many;
    kj::Own<kj::PromiseFulfiller<kj::Array<ActorContext::Spawned>>> fulfiller;
    std::string why;  // the latest reason it did not fit
  };

  void taskFailed(kj::Exception&& exception) override;
  void recordLoad(NodeEntry& node, proto::NodeLoad::Reader load);
  void recordOwnLoad();
  void checkSpawn(const SpawnRequest& request, bool many);
  kj::Array<ActorContext::Spawned> commit(SpawnRequest& request,
                                          const std::vector<uint32_t>& nodeIds);
  void capacityChanged();
  void retryWaiting();
  kj::Promise<void> formCluster();
  kj::Promise<void> checkHeartbeats(kj::TimePoint due);
  void startDriver();
  kj::Promise<void> endJob();
  void callEndCallbacks();
  kj::Promise<void> collectTrace();
  // With --trace: gathers every node's spans and writes the file. Never fails, bounded in time.

  ActorEntry* findActor(uint64_t id);
  NodeEntry* findNode(uint32_t id);
  ActorAddress addressFor(uint64_t id, uint32_t incarnation, uint32_t nodeId,
                          const SpawnRequest& spec);
  void hostOn(ActorEntry& entry);
  void warnUnknownPreferences(const Placement& placement);
  void nodeLost(uint32_t nodeId, std::string why);
  void drain(uint32_t nodeId, std::string reason);
  bool formedEnough() const;
  // Every group has the nodes the job starts with: all its hosts, or --start-with's count.
  void membershipEvent(std::string line);
  // Logged now, and again in the summary at the job's end.
  std::unique_ptr<ControlServer> control_;  // the control path: liveness, judged on its thread
  void fence(NodeEntry& lost, const std::string& why);
  kj::Promise<void> terminate(uint64_t id, Exit reason, bool alreadyGone, bool mayRestart);
  kj::Promise<void> stopChildren(uint64_t id);
  kj::Promise<void> stopOnNode(ActorEntry& entry, Exit reason);
  bool tryRestart(ActorEntry& entry, Exit& reason);
  void restartOn(ActorEntry& entry, uint32_t nodeId, const Exit& reason);
  void waitToRestart(ActorEntry& entry, const Exit& reason, const std::string& why);
  void retryRestarts();
  void endRestartWait(uint64_t id, Exit reason);
  void finalize(uint64_t id, Exit reason);
  void releaseResources(ActorEntry& entry);
  void announceHeadActors();
  std::string originLine(const ActorEntry& entry, const Exit& reason) const;

  NodeRuntime& node_;
  kj::TimePoint startedAt_;
  DriverFunction driverFn_;
  kj::Own<Driver> driver_;
  kj::TaskSet tasks_;
  sched::ClusterView view_;
  std::map<uint32_t, NodeEntry> nodes_;
  uint32_t nextNodeId_ = 1;
  std::map<uint64_t, ActorEntry> actors_;
  std::vector<uint64_t> rootChildren_;
  std::map<uint64_t, Exit> tombstones_;
  std::set<std::string> warnedPreferences_;
  std::map<std::string, uint64_t> names_;
  uint64_t nextActorId_ = 1;
  std::map<uint64_t, Waiting> waiting_;  // spawns waiting for capacity, in request order
  std::map<uint64_t, RestartWait> restartWaits_;  // by actor id
  uint64_t nextWaiting_ = 0;
  bool retryScheduled_ = false;
  kj::Own<kj::PromiseFulfiller<void>> formed_;
  kj::Promise<void> driverTask_ = nullptr;
  bool driverRunning_ = false;
  bool finishing_ = false;
  bool signalled_ = false;  // this process got SIGTERM or SIGINT
  std::map<std::string, unsigned> startWith_;  // --start-with: group -> nodes to start with
  std::vector<kj::Function<void(const NodeInfo&)>> joinedCallbacks_;
  std::vector<kj::Function<void(const JobEnd&)>> endCallbacks_;
  std::vector<std::string> membership_;  // joined late, rejoined, left: for the summary
  // Actors started on nodes (restarts too) and the bytes of their arguments sent: the job's end
  // says them (what spawning costs the head; a benchmark reads them).
  uint64_t hosted_ = 0, hostedArgBytes_ = 0;
  int code_ = 0;
  std::string reason_;
  kj::Own<kj::PromiseFulfiller<void>> finishFulfiller_;
  kj::ForkedPromise<void> finished_;
};

class ClusterSession final : public proto::Cluster::Server {
  // The head's Cluster capability as one connection (or the head itself) sees it: a node that
  // joins over this session is declared lost when the connection drops.
 public:
  ClusterSession(Head& head, kj::Maybe<Connection&> connection)
      : head_(head), connection_(connection) {}

  kj::Promise<void> join(JoinContext call) override;
  kj::Promise<void> heartbeat(HeartbeatContext call) override;
  kj::Promise<void> spawn(SpawnContext call) override;
  kj::Promise<void> resolve(ResolveContext call) override;
  kj::Promise<void> lookup(LookupContext call) override;
  kj::Promise<void> actorExited(ActorExitedContext call) override;
  kj::Promise<void> link(LinkContext call) override;
  kj::Promise<void> monitor(MonitorContext call) override;
  kj::Promise<void> stop(StopContext call) override;
  kj::Promise<void> finish(FinishContext call) override;
  kj::Promise<void> leave(LeaveContext call) override;

 private:
  Head& head_;
  kj::Maybe<Connection&> connection_;
};

}  // namespace troupe
