#include "node/node.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "trace/trace_collect.h"
#include "troupe/exit_codes.h"
#include "troupe/log.h"

namespace troupe {

bool tokensEqual(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b) {
  // Runs over the longer input whatever the contents, so timing says nothing about the token.
  size_t n = kj::max(a.size(), b.size());
  kj::byte diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    kj::byte x = i < a.size() ? a[i] : 0;
    kj::byte y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// =======================================================================================
// Connection

Connection::Connection(kj::Own<CoalescingStream> stream, capnp::rpc::twoparty::Side side,
                       capnp::Capability::Client bootstrap, capnp::ReaderOptions options,
                       std::string peer)
    : stream_(kj::mv(stream)),
      messages_(*stream_),
      network_(messages_, side, options),
      lending_(network_, messages_),
      rpc_(capnp::makeRpcServer(lending_, kj::mv(bootstrap))),
      disconnected_(network_.onDisconnect().fork()),
      peer_(kj::mv(peer)) {}

Connection::~Connection() noexcept(false) {}

void Connection::awaitLogin(kj::Promise<void> deadline, kj::Own<PreLoginSlot> slot,
                            PreLoginLimit* limit) {
  loginDeadline_ = deadline.eagerlyEvaluate(nullptr);
  loginSlot_ = kj::mv(slot);
  loginLimit_ = limit;
}

void Connection::loggedIn() {
  loginDeadline_ = nullptr;
  loginSlot_ = nullptr;
  if (loginLimit_ != nullptr) loginLimit_->lift();
  loginLimit_ = nullptr;
}

void Connection::abort(kj::StringPtr reason) {
  stream_->abort(KJ_EXCEPTION(DISCONNECTED, reason));
}

capnp::Capability::Client Connection::peerBootstrap() {
  capnp::word scratch[4];
  memset(scratch, 0, sizeof(scratch));
  capnp::MallocMessageBuilder message(scratch);
  auto vatId = message.getRoot<capnp::rpc::twoparty::VatId>();
  vatId.setSide(network_.getSide() == capnp::rpc::twoparty::Side::CLIENT
                    ? capnp::rpc::twoparty::Side::SERVER
                    : capnp::rpc::twoparty::Side::CLIENT);
  return rpc_.bootstrap(vatId);
}

// =======================================================================================
// The Node and Gate servers

namespace {

class NodeServer final : public proto::Node::Server {
 public:
  explicit NodeServer(NodeRuntime& node) : node_(node) {}

  kj::Promise<void> host(HostContext call) override {
    auto params = call.getParams();
    auto client = node_.host(params.getSpec(), ActorAddress::fromProto(params.getAddress()));
    call.getResults().setActor(kj::mv(client));
    return kj::READY_NOW;
  }
  kj::Promise<void> resolve(ResolveContext call) override {
    auto id = call.getParams().getId();
    return node_.findOrAwait(id).then(
        [this, call, id](kj::Maybe<proto::Actor::Client> found) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE(client, found) {
            call.getResults().setActor(*client);
            return kj::READY_NOW;
          }
          return KJ_EXCEPTION(DISCONNECTED,
                              kj::str("actor #", id, " is not hosted on ", node_.info().host(),
                                      ": it has exited or lives elsewhere now; ask the "
                                      "cluster for its current address"));
        });
  }
  kj::Promise<void> stop(StopContext call) override {
    auto p = call.getParams();
    return node_.stopActor(p.getId(), Exit::fromProto(p.getReason()),
                           p.getTimeoutMs() * kj::MILLISECONDS);
  }
  kj::Promise<void> kill(KillContext call) override {
    auto p = call.getParams();
    node_.killActor(p.getId(), Exit::fromProto(p.getReason()));
    return kj::READY_NOW;
  }
  kj::Promise<void> exit(ExitContext call) override {
    int status = call.getParams().getStatus();
    std::string reason = call.getParams().getReason();
    return node_.stopAll(Exit::shutdown("the job is ending")).then([this, status, reason]() {
      node_.requestExit(status, reason);
    });
  }
  kj::Promise<void> ping(PingContext) override { return kj::READY_NOW; }
  kj::Promise<void> fence(FenceContext call) override {
    node_.fenced(call.getParams().getReason().cStr());
    return kj::READY_NOW;
  }
  kj::Promise<void> peerLost(PeerLostContext call) override {
    auto p = call.getParams();
    node_.fencePeer(p.getHost(), p.getAddress(), p.getReason(), p.getIncarnation());
    return kj::READY_NOW;
  }
  kj::Promise<void> actorRestarted(ActorRestartedContext call) override {
    node_.noteRestart(call.getParams().getId(), call.getParams().getIncarnation());
    return kj::READY_NOW;
  }
  kj::Promise<void> headActors(HeadActorsContext call) override {
    std::vector<ActorAddress> actors;
    for (auto a : call.getParams().getActors()) actors.push_back(ActorAddress::fromProto(a));
    node_.setHeadActors(kj::mv(actors));
    return kj::READY_NOW;
  }
  kj::Promise<void> traceClock(TraceClockContext call) override {
    call.getResults().setMicros(trace::now());
    return kj::READY_NOW;
  }
  kj::Promise<void> traceRead(TraceReadContext call) override {
    auto p = call.getParams();
    if (p.getFrom() == 0) traceSnapshot_ = trace::snapshot();
    fillTraceChunk(traceSnapshot_, p.getFrom(), kj::min(p.getMax(), TraceCollector::kChunkSpans),
                   call.getResults().initChunk());
    return kj::READY_NOW;
  }

 private:
  NodeRuntime& node_;
  trace::Snapshot traceSnapshot_;  // what Node.traceRead pages through
};

class GateServer final : public proto::Gate::Server {
 public:
  GateServer(NodeRuntime& node, Connection*& connection, std::string peer)
      : node_(node), connection_(connection), peer_(kj::mv(peer)) {}

  kj::Promise<void> login(LoginContext call) override {
    if (!admitted(call.getParams().getToken())) {
      return KJ_EXCEPTION(FAILED, "authentication failed: wrong cluster token");
    }
    if (connection_ != nullptr) {
      connection_->loggedIn();
      connection_->setPeerHost(call.getParams().getHost(), call.getParams().getIncarnation());
      connection_->describePeer(node_.describeHost(call.getParams().getHost()));
    }
    auto results = call.getResults();
    results.setNode(node_.selfClient());
    KJ_IF_MAYBE(head, node_.head()) {
      kj::Maybe<Connection&> conn;
      if (connection_ != nullptr) conn = *connection_;
      results.setCluster(head->session(conn));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> status(StatusContext call) override {
    // A status client is admitted as a node is, but it gets a snapshot, no capability: it joins
    // nothing, holds nothing, and its connection's end changes nothing.
    if (!admitted(call.getParams().getToken())) {
      return KJ_EXCEPTION(FAILED, "authentication failed: wrong cluster token");
    }
    auto results = call.getResults();
    KJ_IF_MAYBE(head, node_.head()) {
      // It proved the secret: it may stay and ask again, past the login deadline.
      if (connection_ != nullptr) connection_->loggedIn();
      head->status(results.initStatus());
    } else {
      results.setHead(node_.headHost());
      results.setHeadAddress(node_.hosts().addressOf(node_.headHost()));
    }
    return kj::READY_NOW;
  }

 private:
  // With TLS the handshake has proved the peer holds the secret; the token travels (and is
  // checked) only with --insecure.
  bool admitted(kj::ArrayPtr<const kj::byte> token) {
    if (node_.secure()) return true;
    auto expected = kj::StringPtr(node_.options().token.c_str()).asBytes();
    if (tokensEqual(token, expected)) return true;
    node_.refused(peer_, "wrong cluster token");
    return false;
  }

  NodeRuntime& node_;
  Connection*& connection_;  // set right after the connection is made
  std::string peer_;
};

}  // namespace

// =======================================================================================
// RefusalLog

class RefusalLog final : private kj::TaskSet::ErrorHandler {
  // Refused connections and logins, logged once per peer address per interval: the first at
  // once, the rest as one line with their count when the interval ends.
 public:
  explicit RefusalLog(kj::Timer& timer) : timer_(timer), tasks_(*this) {}

  static constexpr kj::Duration kInterval = 10 * kj::SECONDS;

  void note(const std::string& peer, const std::string& why) {
    auto address = peer.substr(0, peer.rfind(':'));
    auto it = byAddress_.find(address);
    if (it != byAddress_.end()) {
      ++it->second.unlogged;
      it->second.lastWhy = why;
      return;
    }
    spdlog::warn("refused a connection from {}: {}", peer, why);
    byAddress_.emplace(address, Entry{});
    tasks_.add(timer_.afterDelay(kInterval).then([this, address]() {
      auto it = byAddress_.find(address);
      if (it == byAddress_.end()) return;
      if (it->second.unlogged > 0) {
        spdlog::warn("refused {} more connections from {} in the last {} s (the last: {})",
                     it->second.unlogged, address, kInterval / kj::SECONDS, it->second.lastWhy);
      }
      byAddress_.erase(it);
    }));
  }

 private:
  struct Entry {
    unsigned unlogged = 0;
    std::string lastWhy;
  };
  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("refusal log: {}", e.getDescription().cStr());
  }

  kj::Timer& timer_;
  std::map<std::string, Entry> byAddress_;
  kj::TaskSet tasks_;
};

// =======================================================================================
// NodeRuntime

NodeRuntime::NodeRuntime(EventLoop& loop, const Registry& registry, RunOptions options,
                         ClusterConfig config, HostMap hosts, NodeInfo::Size size,
                         SageMakerEnv sagemaker)
    : loop_(loop),
      registry_(registry),
      options_(kj::mv(options)),
      config_(kj::mv(config)),
      hosts_(kj::mv(hosts)),
      sagemaker_(kj::mv(sagemaker)),
      tasks_(*this),
      self_(nullptr),
      exitRequested_(nullptr) {
  headHost_ = config_.headHost(options_.headGroup);
  info_ = NodeInfo(config_.currentHost, config_.currentGroup, config_.currentInstanceType,
                   hosts_.addressOf(config_.currentHost), headHost_ == config_.currentHost,
                   options_.incarnation, kj::mv(size));
  self_ = kj::heap<NodeServer>(*this);
  refusals_ = kj::heap<RefusalLog>(loop_.timer());
  if (options_.insecure) {
    spdlog::warn(
        "TLS is off (--insecure / TROUPE_INSECURE): connections are plaintext and the job secret "
        "crosses the network in every login; anyone who can reach this node's port can read the "
        "job's traffic, and anyone who sees the secret can join");
  } else {
    tls_ = kj::heap<JobTls>(options_.token);
  }
  auto paf = kj::newPromiseAndFulfiller<void>();
  exitFulfiller_ = kj::mv(paf.fulfiller);
  exitRequested_ = paf.promise.fork();
}

NodeRuntime::~NodeRuntime() noexcept(false) {}

capnp::ReaderOptions NodeRuntime::readerOptions() const {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = options_.maxMessageBytes / sizeof(capnp::word);
  return o;
}

void NodeRuntime::taskFailed(kj::Exception&& exception) {
  spdlog::debug("background task failed: {}", exception.getDescription().cStr());
}

void NodeRuntime::listen() {
  std::string address = info_.address();
  // Bind the port on every interface when the host map gives no address of our own.
  std::string bindTo = address;
  if (hosts_.addresses.count(config_.currentHost) == 0) {
    bindTo = "*:" + std::to_string(hosts_.defaultPort);
  }
  try {
    auto addr = loop_.io().getNetwork().parseAddress(bindTo).wait(loop_.waitScope());
    listener_ = addr->listen();
  } catch (const kj::Exception& e) {
    throw ConfigError("cannot listen on " + bindTo + " for host '" + config_.currentHost +
                      "': " + e.getDescription().cStr() +
                      "; is another process using the port? pick another with --port or the "
                      "host map");
  }
  tasks_.add(acceptLoop(*listener_));
}

kj::Promise<void> NodeRuntime::acceptLoop(kj::ConnectionReceiver& receiver) {
  // evalNow: kj's accept() throws at once (not through its promise) when accept4 fails on the
  // first try, as with EMFILE.
  return kj::evalNow([&receiver]() { return receiver.accept(); })
      .then(
          [this, &receiver](kj::Own<kj::AsyncIoStream> stream) {
            if (acceptFailures_ > 0) {
              spdlog::info("accepting connections again, after {} failed attempts",
                           acceptFailures_);
              acceptFailures_ = 0;
              acceptBackoff_ = 100 * kj::MILLISECONDS;
            }
            accepted(kj::mv(stream));
            return acceptLoop(receiver);
          },
          [this, &receiver](kj::Exception&& e) {
            // Out of file descriptors (EMFILE, ENFILE) or kernel memory: the connection stays
            // queued in the backlog. Try again later instead of giving up on accepting for good.
            if (acceptFailures_++ == 0) {
              spdlog::warn(
                  "cannot accept a connection on {}: {}; trying again every {} ms until it works",
                  info_.address().cStr(), e.getDescription().cStr(),
                  (1 * kj::SECONDS) / kj::MILLISECONDS);
            }
            auto delay = acceptBackoff_;
            acceptBackoff_ = kj::min(acceptBackoff_ * 2, 1 * kj::SECONDS);
            return loop_.timer().afterDelay(delay).then(
                [this, &receiver]() { return acceptLoop(receiver); });
          });
}

void NodeRuntime::refused(const std::string& peer, const std::string& why) {
  refusals_->note(peer, why);
}

void NodeRuntime::accepted(kj::Own<kj::AsyncIoStream> stream) {
  auto peer = peerName(*stream);
  std::string full;
  auto slot = loginPlaces_.take(peer, full);
  if (slot.get() == nullptr) {
    refused(peer, full + "; closed at once");
    return;
  }
  try {
    setNoDelay(*stream);
  } catch (...) {
  }
  auto deadline = loop_.timer().now() + options_.loginTimeoutMs * kj::MILLISECONDS;
  if (tls_.get() == nullptr) {
    auto limited = kj::heap<PreLoginLimit>(kj::mv(stream), kPreLoginPlainBytes);
    auto* limit = limited.get();
    adopt(kj::mv(limited), peer, kj::mv(slot), deadline, limit);
    return;
  }
  auto limited = kj::heap<PreLoginLimit>(kj::mv(stream), kPreLoginTlsBytes);
  PreLoginLimit& limit = *limited;  // owned by the TLS stream from here on
  tasks_.add(loop_.timer()
                 .timeoutAt(deadline, tls_->wrapServer(kj::mv(limited)))
                 .then(
                     [this, peer, &limit, slot = kj::mv(slot),
                      deadline](kj::Own<kj::AsyncIoStream> secure) mutable {
                       limit.lift();
                       adopt(kj::mv(secure), peer, kj::mv(slot), deadline, nullptr);
                     },
                     [this, peer](kj::Exception&& e) {
                       if (e.getType() == kj::Exception::Type::OVERLOADED) {
                         refused(peer, "no TLS handshake within " +
                                           std::to_string(options_.loginTimeoutMs) +
                                           " ms (--login-timeout-ms)");
                       } else {
                         std::string why = e.getDescription().cStr();
                         kj::StringPtr auth = "authentication failed: ";
                         if (why.rfind(auth.cStr(), 0) == 0) {
                           why = why.substr(auth.size());  // "the peer does not hold ..."
                         } else {
                           // OpenSSL's "...:SSL routines::no shared cipher": keep the reason.
                           auto colons = why.rfind("::");
                           if (colons != std::string::npos) why = why.substr(colons + 2);
                           why = "TLS handshake failed: " + why;
                         }
                         refused(peer, why);
                       }
                     }));
}

void NodeRuntime::adopt(kj::Own<kj::AsyncIoStream> stream, std::string peer,
                        kj::Own<PreLoginSlot> slot, kj::TimePoint deadline, PreLoginLimit* limit) {
  auto id = nextInbound_++;
  // The gate needs the connection (to learn of its end) but is made before it.
  auto connSlot = kj::heap<Connection*>(nullptr);
  auto gate = kj::heap<GateServer>(*this, *connSlot, peer);
  auto conn =
      kj::heap<Connection>(kj::heap<CoalescingStream>(kj::mv(stream), &loop_.timer()),
                           capnp::rpc::twoparty::Side::SERVER, kj::mv(gate), readerOptions(), peer);
  *connSlot = conn.get();
  conn->awaitLogin(loop_.timer().atTime(deadline).then([this, id, peer]() {
    auto it = inbound_.find(id);
    if (it == inbound_.end()) return;
    auto why =
        "no login within " + std::to_string(options_.loginTimeoutMs) + " ms (--login-timeout-ms)";
    refused(peer, why);
    it->second->abort(why.c_str());
  }),
                   kj::mv(slot), limit);
  tasks_.add(
      conn->onDisconnect()
          .then([]() -> kj::Maybe<kj::Exception> { return nullptr; },
                [](kj::Exception&& e) -> kj::Maybe<kj::Exception> { return kj::mv(e); })
          .then([this, id, peer,
                 connSlot = kj::mv(connSlot)](kj::Maybe<kj::Exception> error) mutable {
            auto it = inbound_.find(id);
            if (it != inbound_.end() && it->second->sentTooMuchBeforeLogin()) {
              refused(peer, "it sent more than " + std::to_string(kPreLoginPlainBytes / 1024) +
                                " KiB before logging in");
            } else KJ_IF_MAYBE(e, error) {
              spdlog::debug("connection from {} dropped: {}", peer, e->getDescription().cStr());
            }
            *connSlot = nullptr;
            // Destroy the connection outside of its own disconnect callback.
            return kj::evalLater([this, id]() { inbound_.erase(id); });
          }));
  inbound_.emplace(id, kj::mv(conn));
}

kj::Promise<kj::Own<Connection>> NodeRuntime::connect(const std::string& address) {
  return loop_.io()
      .getNetwork()
      .parseAddress(address)
      .then([](kj::Own<kj::NetworkAddress> addr) {
        auto connecting = addr->connect();
        return connecting.attach(kj::mv(addr));
      })
      .then([this, address](
                kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        setNoDelay(*stream);
        if (tls_.get() == nullptr) return kj::mv(stream);
        auto timeout = options_.loginTimeoutMs * kj::MILLISECONDS;
        return loop_.timer()
            .timeoutAfter(timeout, tls_->wrapClient(kj::mv(stream)))
            .catch_([this, address](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
              if (e.getType() != kj::Exception::Type::OVERLOADED)
                kj::throwFatalException(kj::mv(e));
              kj::throwFatalException(
                  KJ_EXCEPTION(DISCONNECTED, kj::str("no TLS handshake with ", address.c_str(),
                                                     " within ", options_.loginTimeoutMs, " ms")));
            });
      })
      .then([this, address](kj::Own<kj::AsyncIoStream> stream) {
        auto connection = kj::heap<Connection>(
            kj::heap<CoalescingStream>(kj::mv(stream), &loop_.timer()),
            capnp::rpc::twoparty::Side::CLIENT,
            capnp::Capability::Client(nullptr), readerOptions(), address);
        connection->describePeer(describeAddress(address));
        return connection;
      });
}

std::string NodeRuntime::describeAddress(const std::string& address) const {
  for (auto& host : config_.hosts) {
    if (hosts_.addressOf(host) == address) return describeHost(host);
  }
  return "the node at " + address;
}

std::string NodeRuntime::describeHost(const std::string& host) const {
  if (std::find(config_.hosts.begin(), config_.hosts.end(), host) == config_.hosts.end()) {
    return "node " + host;  // not in the cluster file (it was refused at login)
  }
  return "node " + host + " (" + config_.groupOf(host).name + ") at " + hosts_.addressOf(host);
}

proto::Node::Client NodeRuntime::peerNode(const std::string& address) {
  if (address == info_.address()) return self_;
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second.node;
  KJ_IF_MAYBE(h, head_) {
    // The head already holds a connection to every worker that joined.
    return h->nodeAt(address, nullptr);
  }
  // Callbacks of a connection that was fenced (and maybe replaced) must not touch its successor.
  auto generation = nextPeerGeneration_++;
  auto dropPeer = [this, address, generation]() {
    auto it = peers_.find(address);
    if (it != peers_.end() && it->second.generation == generation) peers_.erase(it);
  };
  auto canceler = kj::heap<kj::Canceler>();
  auto connected = canceler->wrap(connect(address))
                       .then([this, address, generation, dropPeer](kj::Own<Connection> conn) {
                         auto login = conn->peerBootstrap().castAs<proto::Gate>().loginRequest();
                         if (!secure()) {
                           login.setToken(kj::StringPtr(options_.token.c_str()).asBytes());
                         }
                         login.setHost(info_.host());
                         login.setIncarnation(info_.incarnation());
                         proto::Node::Client node = login.send().getNode();
                         tasks_.add(conn->onDisconnect().then(
                             [dropPeer]() { return kj::evalLater(dropPeer); },
                             [dropPeer](kj::Exception&&) { return kj::evalLater(dropPeer); }));
                         auto it = peers_.find(address);
                         KJ_ASSERT(it != peers_.end() && it->second.generation == generation);
                         it->second.connection = kj::mv(conn);
                         return node;
                       })
                       .fork();
  tasks_.add(connected.addBranch().ignoreResult().catch_([address, dropPeer](kj::Exception&& e) {
    spdlog::warn("cannot connect to {}: {}", address, e.getDescription().cStr());
    dropPeer();
  }));
  proto::Node::Client client = connected.addBranch();
  peers_.emplace(address, Peer{client, kj::Own<Connection>(), kj::mv(canceler), generation});
  return client;
}

void NodeRuntime::fencePeer(const std::string& host, const std::string& address,
                            const std::string& reason, uint32_t incarnation) {
  auto why = kj::str("node ", host, " was declared lost: ", reason);
  size_t cut = 0;
  for (auto& [id, conn] : inbound_) {
    if (conn->peerHost() == host && conn->peerIncarnation() <= incarnation) {
      conn->abort(why);
      ++cut;
    }
  }
  auto it = peers_.find(address);
  if (it != peers_.end()) {
    // Out of the cache now: a later call connects anew (to a restarted instance, say).
    auto peer = kj::mv(it->second);
    peers_.erase(it);
    peer.connecting->cancel(why);
    if (peer.connection.get() != nullptr) {
      peer.connection->abort(why);
      ++cut;
    }
    // Destroyed next turn: its disconnect callbacks may be running up the stack.
    tasks_.add(kj::evalLater([peer = kj::mv(peer)]() {}));
  }
  if (cut > 0) spdlog::info("cut {} connection(s) with {}: {}", cut, host, reason);
}

proto::Cluster::Client NodeRuntime::cluster() {
  KJ_IF_MAYBE(c, cluster_) {
    return *c;
  }
  KJ_FAIL_REQUIRE("this node has not joined the cluster yet");
}

void NodeRuntime::fenced(const std::string& why) {
  requestExit(FENCED, "the head declared this node lost and cut it off (" + why +
                          "); its actors run elsewhere now" + (stallNote_ ? stallNote_() : ""));
}

void NodeRuntime::requestExit(int code, std::string reason) {
  if (exiting()) return;
  if (code == FENCED && leaving_) {
    // Lost while it was leaving (frozen or cut off mid-drain): its work was being moved anyway
    // and has been, so it ends as a drained node does; a 7 would fail the job on SageMaker.
    code = OK;
    reason = "drained: the head declared this node lost while it was leaving (" + reason + ")";
  }
  exitCode_ = code;
  exitReason_ = reason;
  if (code != 0) {
    spdlog::error("exiting with {} ({}): {}", code, exitCodeName(code), firstLine(reason));
  } else {
    spdlog::info("exiting with 0: {}", reason);
  }
  exitFulfiller_->fulfill();
}

}  // namespace troupe
