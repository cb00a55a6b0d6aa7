// The per-process core: this node's identity, its listener and connections, the actors it hosts,
// and the way the process ends. Private to the runtime.

#pragma once

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "actor/actor_host.h"
#include "node/head_link.h"
#include "loop/cpu_meter.h"
#include "net/coalescing_stream.h"
#include "net/lending.h"
#include "net/login_places.h"
#include "net/message_stream.h"
#include "net/secure.h"
#include "troupe/actor.h"
#include "troupe/config.h"
#include "troupe/registry.h"
#include "troupe/run_options.h"

namespace troupe {

class RefusalLog;

// An accepted connection's place among its node's unauthenticated ones, while it lives.
using PreLoginSlot = LoginPlaces::Place;

class Connection {
  // One RPC connection: a TCP stream (TCP_NODELAY, writes coalesced per event-loop turn), its
  // two-party network and RPC system. The acceptor side exports `bootstrap` (a Gate).
 public:
  Connection(kj::Own<CoalescingStream> stream, capnp::rpc::twoparty::Side side,
             capnp::Capability::Client bootstrap, capnp::ReaderOptions options, std::string peer);
  ~Connection() noexcept(false);
  KJ_DISALLOW_COPY(Connection);

  capnp::Capability::Client peerBootstrap();
  kj::Promise<void> onDisconnect() { return disconnected_.addBranch(); }
  const std::string& peer() const { return peer_; }
  const std::string& peerHost() const { return peerHost_; }
  void setPeerHost(std::string host, uint32_t incarnation) {
    peerHost_ = kj::mv(host);
    peerIncarnation_ = incarnation;
  }
  void describePeer(std::string text) { messages_.describePeer(kj::mv(text)); }
  // What a call on this connection names when the connection closes or breaks.
  uint32_t peerIncarnation() const { return peerIncarnation_; }
  // The host the peer said it is when it logged in ("" for connections this node opened).

  void abort(kj::StringPtr reason);
  // Cuts the connection now, whether or not the peer can hear: every call in flight on it fails
  // with a DISCONNECTED exception carrying `reason`, and onDisconnect() resolves.

  void awaitLogin(kj::Promise<void> deadline, kj::Own<PreLoginSlot> slot, PreLoginLimit* limit);
  // An accepted connection whose peer has not logged in yet: `deadline` resolves when it must
  // have, `slot` counts it among the node's unauthenticated connections, and `limit` (with
  // --insecure) caps what it may send. loggedIn() ends all three.
  void loggedIn();
  bool sentTooMuchBeforeLogin() const { return loginLimit_ != nullptr && loginLimit_->exceeded(); }

 private:
  kj::Own<CoalescingStream> stream_;
  kj::Maybe<kj::Promise<void>> loginDeadline_;
  kj::Own<PreLoginSlot> loginSlot_;
  PreLoginLimit* loginLimit_ = nullptr;
  IncomingMessageStream messages_;  // large messages in buffers troupe::Received can keep
  capnp::TwoPartyVatNetwork network_;
  LendingNetwork lending_;  // what the RPC system sees: messages hold the SendBuffers they lend
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
  kj::ForkedPromise<void> disconnected_;
  std::string peer_;
  std::string peerHost_;
  uint32_t peerIncarnation_ = 0;
};

class NodeRuntime final : public ActorHost, private kj::TaskSet::ErrorHandler {
 public:
  NodeRuntime(EventLoop& loop, const Registry& registry, RunOptions options, ClusterConfig config,
              HostMap hosts, NodeInfo::Size size, SageMakerEnv sagemaker);
  // `size`: what this node offers (run() measures it before the event loop starts, which needs
  // the vcpus); its host, group and address come from `config` and `hosts`.
  ~NodeRuntime() noexcept(false);

  EventLoop& loop() override { return loop_; }
  const NodeInfo& info() const override { return info_; }
  const SageMakerEnv& sagemaker() const override { return sagemaker_; }
  const RunOptions& options() const override { return options_; }
  const ClusterConfig& config() const { return config_; }
  const HostMap& hosts() const { return hosts_; }
  const Registry& registry() const { return registry_; }
  const std::string& headHost() const { return headHost_; }
  capnp::ReaderOptions readerOptions() const;

  // -- network --
  void listen();
  // Binds this node's address and starts accepting. Throws ConfigError when it cannot.
  kj::Promise<kj::Own<Connection>> connect(const std::string& address);
  // A client connection to another node's port (no login yet).
  proto::Node::Client selfClient() { return self_; }
  proto::Node::Client peerNode(const std::string& address) override;
  std::string describeAddress(const std::string& address) const;
  // "node algo-3 (data_group) at 10.0.0.3:7077", or "the node at ..." for an address of no host.
  std::string describeHost(const std::string& host) const;
  // The same for a host of the cluster.
  // The Node capability of the node listening at `address`, over a direct connection cached per
  // peer (or this node itself).

  void fencePeer(const std::string& host, const std::string& address, const std::string& reason,
                 uint32_t incarnation);
  // Drops every connection to and from `host`'s processes up to `incarnation` (listening at
  // `address`): the head declared that process lost. Calls in flight to it fail with
  // DISCONNECTED; a later peerNode(address) connects anew (to a newer process of the host).

  proto::Cluster::Client cluster() override;
  // The head's Cluster capability (local on the head).
  void setCluster(proto::Cluster::Client cluster) { cluster_ = kj::mv(cluster); }
  void setHead(HeadLink& head) { head_ = head; }
  kj::Maybe<HeadLink&> head() { return head_; }
  // The head this node hosts (on the head's instance only).

  // -- hosting --
  proto::Actor::Client host(proto::SpawnSpec::Reader spec, ActorAddress address);
  kj::Maybe<proto::Actor::Client> find(uint64_t id);
  kj::Promise<kj::Maybe<proto::Actor::Client>> findOrAwait(uint64_t id);
  // find(), and for an id never hosted here yet, its host() awaited up to kHostAwait: a spawn
  // hands out the actor's address at once, and another actor may resolve it here before the
  // head's host() call has arrived. An id hosted here before, now gone, answers nothing at once.
  static constexpr kj::Duration kHostAwait = 10 * kj::SECONDS;
  kj::Promise<void> stopActor(uint64_t id, Exit reason, kj::Duration timeout);
  // Runs the actor's onStop() within `timeout`, then drops it.
  void killActor(uint64_t id, Exit reason);
  kj::Promise<void> stopAll(Exit reason);
  // Stops every hosted actor, newest first.
  void actorExited(uint64_t id, Exit reason) override;
  // The actor ended by itself (ActorContext::exit, or its onStart() failed): tell the head.
  void loopHeld(const ActorAddress& actor, const std::string& method, int64_t heldUs) override;
  void methodEntered(const ActorAddress& actor, const std::string* method) override {
    lastActorId_ = actor.id;
    lastMethod_ = method;
  }
  void loopLate(kj::Duration late);
  // The event loop ran a timer `late` after it was due: past --stall-warn-ms with no method body
  // to account for it, say so, naming the last method that started (its continuation may have
  // held the loop).
  void reportLoad(proto::NodeLoad::Builder load);
  // This process's CPU use since the previous report, and the mailbox depth of every actor it
  // hosts: what a worker sends with each heartbeat (the head records its own on that schedule).

  void setHeadActors(std::vector<ActorAddress> actors) { headActors_ = kj::mv(actors); }
  void noteRestart(uint64_t id, uint32_t incarnation) {
    auto& latest = incarnations_[id];
    latest = std::max(latest, incarnation);
  }
  // The head restarted `id` as `incarnation` (Node.actorRestarted).
  uint32_t latestIncarnation(uint64_t id) const override {
    auto it = incarnations_.find(id);
    return it == incarnations_.end() ? 0 : it->second;
  }
  std::string headActorsLine() const;
  // ", and with it 'trainer' (train.Trainer #1)" when the head hosted actors, else "".

  // -- the end --
  void setStallNote(std::function<std::string()> note) { stallNote_ = kj::mv(note); }
  // What the control thread saw of this node's recent stalls (ControlClient::stallNote), added to
  // the reason of a FENCED exit: the head fences a node it stopped hearing from.
  void fenced(const std::string& why);
  // The head declared this node lost (`why`, its verdict), by a call or in a heartbeat's answer:
  // exit FENCED, saying so and what held this node back.
  void requestExit(int code, std::string reason);
  // Ends this process with `code` once the current turn is over. The first call wins. A node
  // that asked to leave (leaving()) and is then declared lost exits 0, as a drained one does.
  void leaving() { leaving_ = true; }
  // This worker asked the head to let it leave (SIGTERM to it alone: a drain).
  kj::Promise<void> whenExitRequested() { return exitRequested_.addBranch(); }
  int exitCode() const { return exitCode_; }
  const std::string& exitReason() const { return exitReason_; }
  // The one line saying why the process ends (for SageMaker's output/failure).
  bool exiting() const { return exitCode_ >= 0; }

  kj::TaskSet& tasks() { return tasks_; }
  bool secure() const { return tls_.get() != nullptr; }
  JobTls* tls() { return tls_.get(); }  // null with --insecure
  void refused(const std::string& peer, const std::string& why);
  // Logs a refused connection or login, at most once per peer address per interval (with the
  // count of those not logged).

 private:
  struct Hosted {
    ActorAddress address;
    proto::Actor::Client client;
    ActorCore* core;
    kj::Duration stopTimeout;
    kj::Promise<void> started = nullptr;
    bool stopping = false;
  };
  struct Peer {
    proto::Node::Client node;
    kj::Own<Connection> connection;    // null while connecting
    kj::Own<kj::Canceler> connecting;  // cancels the connection attempt
    uint64_t generation;               // which connection to this address it is
  };

  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> acceptLoop(kj::ConnectionReceiver& receiver);
  void accepted(kj::Own<kj::AsyncIoStream> stream);
  void adopt(kj::Own<kj::AsyncIoStream> stream, std::string peer, kj::Own<PreLoginSlot> slot,
             kj::TimePoint deadline, PreLoginLimit* limit);
  // Serves the Gate on an accepted connection (after its TLS handshake, when on).
  void retire(uint64_t id, Exit reason);
  // Marks a hosted actor exited and takes it out of the directory; it is destroyed once that is
  // safe (see node.cpp).

  EventLoop& loop_;
  const Registry& registry_;
  RunOptions options_;
  // Connections not logged in yet. Before everything that holds a place (tasks_, inbound_), so
  // destroyed after it.
  LoginPlaces loginPlaces_{options_.maxUnauthenticated};
  ClusterConfig config_;
  HostMap hosts_;
  NodeInfo info_;
  SageMakerEnv sagemaker_;
  std::string headHost_;
  kj::TaskSet tasks_;
  proto::Node::Client self_;
  kj::Maybe<proto::Cluster::Client> cluster_;
  kj::Maybe<HeadLink&> head_;
  kj::Own<JobTls> tls_;  // null with --insecure
  kj::Own<RefusalLog> refusals_;
  CpuMeter cpu_;
  kj::Own<kj::ConnectionReceiver> listener_;
  kj::Duration acceptBackoff_ = 100 * kj::MILLISECONDS;
  unsigned acceptFailures_ = 0;   // accept() failures since the last success
  std::map<uint64_t, kj::Own<Connection>> inbound_;
  uint64_t nextInbound_ = 0;
  std::map<std::string, Peer> peers_;
  uint64_t nextPeerGeneration_ = 0;
  std::map<uint64_t, Hosted> actors_;    // by id, which is start order
  std::map<uint64_t, Hosted> retiring_;  // exited, waiting for their calls and pool jobs to end
  std::set<uint64_t> hostedEver_;        // every id host() has started here
  std::map<uint64_t, std::vector<kj::Own<kj::PromiseFulfiller<void>>>> awaitingHost_;
  uint64_t nextRetired_ = 0;
  std::vector<ActorAddress> headActors_;
  std::map<uint64_t, uint32_t> incarnations_;  // noteRestart(): actor id -> newest incarnation
  struct Holds {
    // Method bodies that held the loop past --stall-warn-ms since the last load report.
    uint32_t count = 0;
    int64_t longestUs = 0;
    std::string longestBy;
  } holds_;
  struct Warned {
    int64_t atUs = 0;
    uint32_t since = 0;  // holds not logged since
  };
  std::map<std::string, Warned> holdWarnings_;  // per actor and method (or "" for the loop)
  int64_t lastHoldEndUs_ = 0;                    // when the last method-body hold ended
  uint64_t lastActorId_ = 0;                     // methodEntered()
  const std::string* lastMethod_ = nullptr;
  int exitCode_ = -1;
  std::string exitReason_;
  std::function<std::string()> stallNote_;  // setStallNote
  bool leaving_ = false;
  kj::Own<kj::PromiseFulfiller<void>> exitFulfiller_;
  kj::ForkedPromise<void> exitRequested_;
};

bool tokensEqual(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b);
// Constant-time comparison (no early exit on the first difference).

}  // namespace troupe
