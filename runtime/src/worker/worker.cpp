// A worker node's side of the cluster: join the head (with retry, within a deadline), heartbeat
// on the control path, and exit with the job, on losing the head, or when the head fences it.
// run() makes one on every node that is not the head.

#include "worker/worker.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "control/control.h"
#include "node/head_link.h"  // kDrainWindowMs, kJobEnding: what a worker and its head agree on
#include "node/node.h"
#include "troupe/exit_codes.h"

namespace troupe {

namespace {

// "TLS: certificate verify failed" out of JobTls's "authentication failed: ... (TLS: ...)".
std::string tlsReason(const std::string& text) {
  auto begin = text.find("(TLS: ");
  if (begin == std::string::npos) return text;
  auto end = text.find(')', begin);
  return text.substr(begin + 1, end == std::string::npos ? std::string::npos : end - begin - 1);
}

// A worker: join the head with retry, heartbeat, and exit with the job (or on losing the head).

}  // namespace

class Worker::Impl {
 public:
  explicit Impl(NodeRuntime& node)
      : node_(node),
        headAddress_(node.hosts().addressOf(node.headHost())),
        deadline_(node.loop().timer().now() + joinLimitMs(node) * kj::MILLISECONDS) {}

  void start() {
    node_.loop().onSignal(SIGTERM, [this](int) { interrupted("SIGTERM"); });
    node_.loop().onSignal(SIGINT, [this](int) { interrupted("SIGINT"); });
    node_.tasks().add(attempt(kj::str("")));
  }

  void stopControl() { control_.reset(); }

  void logControlPath() {
    // The heartbeats' round trips on the control path (bench_cluster reads this line).
    if (control_) spdlog::info("control path: {}", control_->roundTrips());
  }

 private:
  std::string headLine() const { return node_.headHost() + " at " + headAddress_; }

  static unsigned joinLimitMs(NodeRuntime& node) {
    // A first process waits the join deadline for the head. One started again in place of a
    // process that was in the job (its incarnation > 0) waits as long, at least as long as the
    // head takes to declare its predecessor lost: a cut that heals within it (a partition of
    // 20 s; the predecessor gave up after the head timeout) ends in a rejoin. It gives up sooner
    // only when nothing listens at the head's address (refusedLimitMs()).
    auto& o = node.options();
    return node.info().incarnation() > 0
               ? std::max(o.joinTimeoutMs, o.headTimeoutMs + o.nodeTimeoutMaxMs)
               : o.joinTimeoutMs;
  }

  // How long a process started again waits while every connect is refused: the head's host
  // answers, but no head listens on it. A head is never started again (its state is the job's),
  // so its job has ended; there is no partition to wait out.
  unsigned refusedLimitMs() const { return std::min(2000u, node_.options().headTimeoutMs); }

  // The job's exit code in a refusal that says the job is ending (kJobEnding, then "OK: ...)"),
  // or -1.
  static int endingJobCode(const std::string& text) {
    static const std::string ending = kJobEnding;
    auto at = text.find(ending);
    if (at == std::string::npos) return -1;
    auto name = text.substr(at + ending.size(), text.find(':', at + ending.size()) - at -
                                                    ending.size());
    for (int code : {OK, JOB_FAILED, CONFIG_ERROR, HEAD_LOST, AUTH_FAILED, JOIN_FAILED,
                     INTERRUPTED, FENCED, INTERNAL_ERROR}) {
      if (name == exitCodeName(code)) return code;
    }
    return -1;
  }

  kj::Promise<void> attempt(kj::String lastError) {
    auto now = node_.loop().timer().now();
    auto incarnation = node_.info().incarnation();
    bool noHead = incarnation > 0 && refusedSince_ &&
                  now - *refusedSince_ >= refusedLimitMs() * kj::MILLISECONDS;
    if (noHead) {
      // The job is over: its head has ended, and a head is never started again. This host's
      // work went elsewhere when its predecessor was lost; the job's outcome is its head's and
      // the other instances', so this host ends 0 rather than fail a job that may have succeeded.
      node_.requestExit(OK, "the job is over: nothing has listened at the head " + headLine() +
                                " for " + std::to_string(refusedLimitMs()) +
                                " ms (connection refused), and a head is never started again; "
                                "this host, started again (incarnation " +
                                std::to_string(incarnation) +
                                "), ends 0: the job's outcome is its head's");
      return kj::READY_NOW;
    }
    if (now > deadline_) {
      std::string why = lastError.cStr();
      if (refusedSince_ && !reached_) {
        // A host started after its job ended reads the same as one whose head never started:
        // neither is a crash of this host (docs/lifecycle.md, "Joining after the job ended").
        why = "nothing listened there the whole time (connection refused): the job's head has "
              "ended, or has not started; check that this host belongs to a running job";
      }
      node_.requestExit(JOIN_FAILED,
                        std::string(incarnation > 0 ? "could not rejoin" : "could not join") +
                            " the head " + headLine() + " within " +
                            std::to_string(joinLimitMs(node_)) + " ms" +
                            (incarnation > 0 ? " (incarnation " + std::to_string(incarnation) + ")"
                                             : std::string()) +
                            ": " + why);
      return kj::READY_NOW;
    }
    // Each attempt is bounded: a connect to a head behind a link that is down hangs for minutes
    // (no RST), past this node's deadline.
    auto remaining = deadline_ - node_.loop().timer().now();
    auto limit = kj::max(kj::min(remaining, 5 * kj::SECONDS), 100 * kj::MILLISECONDS);
    return node_.loop()
        .timer()
        .timeoutAfter(limit, node_.connect(headAddress_))
        .then([this](kj::Own<Connection> conn) {
          auto login = conn->peerBootstrap().castAs<proto::Gate>().loginRequest();
          if (!node_.secure()) {
            login.setToken(kj::StringPtr(node_.options().token.c_str()).asBytes());
          }
          login.setHost(node_.info().host());
          login.setIncarnation(node_.info().incarnation());
          auto cluster = login.send().getCluster();
          auto join = cluster.joinRequest();
          node_.info().toProto(join.initInfo());
          join.setNode(node_.selfClient());
          return join.send().then([this, cluster, conn = kj::mv(conn)](auto response) mutable {
            joined(kj::mv(conn), kj::mv(cluster), response.getNodeId(), response.getControlPort());
          });
        })
        .catch_([this, lastError = kj::mv(lastError)](kj::Exception&& e) -> kj::Promise<void> {
          kj::String what = kj::str(e.getDescription());
          std::string text = what.cStr();
          if (text.find("authentication failed") != std::string::npos) {
            node_.requestExit(
                AUTH_FAILED,
                node_.secure()
                    ? "authentication failed: the head " + headLine() +
                          " and this node hold different job secrets (" + tlsReason(text) +
                          "); start every instance with the same secret (TROUPE_TOKEN_FILE)"
                    : "authentication failed: the head " + headLine() +
                          " refused this node's cluster token; start every instance with the "
                          "same secret (TROUPE_TOKEN_FILE)");
            return kj::READY_NOW;
          }
          if (e.getType() == kj::Exception::Type::FAILED &&
              text.find("host '") != std::string::npos) {
            int jobCode = endingJobCode(text);
            if (jobCode >= 0) {
              // It came up as its job ended: this host ends with the job's outcome, as every
              // instance does (a restarted process told "the job is ending (OK)" exits 0).
              node_.requestExit(jobCode, "the job ended as this node joined; it ends with the "
                                         "job's code, " +
                                             std::to_string(jobCode) + " (" +
                                             exitCodeName(jobCode) + "): " + text);
              return kj::READY_NOW;
            }
            node_.requestExit(
                JOIN_FAILED, "the head refused to let this node join: " + std::string(what.cStr()));
            return kj::READY_NOW;
          }
          // Refused: the head's host answers and nothing listens. Anything else (unreachable, a
          // timeout, a reset) may be a partition or a head not up yet.
          bool refused = text.find(strerror(ECONNREFUSED)) != std::string::npos;
          if (!refused) {
            reached_ = true;
            refusedSince_.reset();
          } else if (!refusedSince_) {
            refusedSince_ = node_.loop().timer().now();
          }
          auto delay = kj::min(backoff_, 2 * kj::SECONDS);
          backoff_ = backoff_ * 2;
          spdlog::debug("joining {} failed ({}); retrying in {} ms", headLine(), what.cStr(),
                        delay / kj::MILLISECONDS);
          return node_.loop().timer().afterDelay(delay).then(
              [this, what = kj::mv(what)]() mutable { return attempt(kj::mv(what)); });
        });
  }

  void joined(kj::Own<Connection> conn, proto::Cluster::Client cluster, uint32_t nodeId,
              uint16_t controlPort) {
    spdlog::info("joined the head {} as node {}", headLine(), nodeId);
    nodeId_ = nodeId;
    node_.setCluster(cluster);
    // Liveness from here on: the control thread's heartbeats to the head's, on a connection of
    // their own (control/control.h).
    try {
      control_ =
          std::make_unique<ControlClient>(ControlSettings::from(node_.options(), node_.tls()),
                                          controlAddress(headAddress_, controlPort), nodeId);
    } catch (const ConfigError& e) {
      node_.requestExit(INTERNAL_ERROR,
                        std::string("cannot start the control thread: ") + e.what());
      return;
    }
    node_.tasks().add(conn->onDisconnect().then(
        [this]() { headGone("the connection closed"); },
        [this](kj::Exception&& e) { headGone(e.getDescription().cStr()); }));
    node_.setStallNote([this]() { return control_ ? control_->stallNote() : std::string(); });
    headConnection_ = kj::mv(conn);
    auto interval = node_.options().heartbeatMs * kj::MILLISECONDS;
    node_.tasks().add(heartbeatLoop(node_.loop().timer().now() + interval));
  }

  void headGone(std::string why) {
    if (node_.exiting()) return;
    // How far this node is behind its own heartbeat schedule: it was frozen (or starved) that
    // long. Past the node timeout the head has declared it lost and cut it off, and the head's
    // `fence` call, though sent first, may be dropped unread with the closed connection.
    // The clock itself, not the loop's timer: the timer's time may not have moved on yet when the
    // closed connection is the first thing a thawed process sees.
    // The control thread's clock says it: an event loop merely held by an actor is no freeze.
    auto behind = (control_ ? control_->frozenMs() : 0) * kj::MILLISECONDS;
    auto nodeTimeout = node_.options().nodeTimeoutMs * kj::MILLISECONDS;
    if (behind > nodeTimeout) {
      node_.requestExit(FENCED, "this node was frozen for " +
                                    std::to_string(behind / kj::MILLISECONDS) +
                                    " ms, past the node timeout (" +
                                    std::to_string(node_.options().nodeTimeoutMs) +
                                    " ms), and the head has cut it off (" + why + ")" +
                                    control_->frozenNote());
      return;
    }
    node_.requestExit(HEAD_LOST,
                      "lost the head " + headLine() + node_.headActorsLine() + ": " + why);
  }

  kj::Promise<void> heartbeatLoop(kj::TimePoint due) {
    // The main loop acts on what the control thread heard, whenever it gets to run; it also sends
    // the node's load report (troupe status), which says nothing about liveness.
    auto interval = node_.options().heartbeatMs * kj::MILLISECONDS;
    return node_.loop().timer().atTime(due).then([this, due, interval]() {
      auto now = node_.loop().timer().now();
      auto stall = now - due;
      node_.loopLate(stall);  // its control thread kept the heartbeats going meanwhile
      if (auto why = control_->fenced()) {
        node_.fenced(*why);
        return kj::Promise<void>(kj::READY_NOW);
      }
      // Counted from the join until the first answer: a head lost right after it is lost within
      // the head timeout too.
      auto silent = control_->sinceHeardMs();
      if (!control_->answered() && silent > int64_t(node_.options().headTimeoutMs)) {
        headGone("no answer on the control path for " + std::to_string(silent) +
                 " ms since joining (--head-timeout-ms " +
                 std::to_string(node_.options().headTimeoutMs) +
                 "; can this node reach the head's control port?)");
        return kj::Promise<void>(kj::READY_NOW);
      } else if (silent > int64_t(node_.options().headTimeoutMs)) {
        headGone("no answer on the control path for " + std::to_string(silent) +
                 " ms (--head-timeout-ms " + std::to_string(node_.options().headTimeoutMs) + ")");
        return kj::Promise<void>(kj::READY_NOW);
      }
      auto req = node_.cluster().heartbeatRequest();
      req.setNodeId(nodeId_);
      node_.reportLoad(req.initLoad());
      node_.tasks().add(req.send().then([this](auto&& reply) {
        if (reply.getFenced()) {
          node_.fenced(reply.getReason().cStr());
        }
      }));
      return heartbeatLoop(now + interval);
    });
  }

  void interrupted(const char* signal) {
    if (node_.exiting()) return;
    if (signalled_) {
      node_.requestExit(INTERRUPTED, std::string("second ") + signal + "; not waiting any longer");
      return;
    }
    signalled_ = true;
    std::string reason = std::string(signal) + " on " + node_.info().host().cStr() + " (" +
                         node_.info().group().cStr() + ")";
    if (headConnection_.get() == nullptr) {
      if (node_.info().incarnation() > 0) {
        // Started again in place of a process the job had lost, and stopped before it rejoined:
        // nothing of the job runs here (its work went elsewhere), so this is a drain, 0, as a
        // stop of a worker that had rejoined would be; the supervisor never restarts a stop.
        node_.requestExit(OK, "drained: " + reason + " while rejoining (incarnation " +
                                  std::to_string(node_.info().incarnation()) +
                                  "); the job's work goes on on the other nodes");
        return;
      }
      node_.requestExit(INTERRUPTED, reason + " before joining");
      return;
    }
    // A stop of this instance alone (a scale-down, a spot reclaim of one instance) is a drain:
    // the head moves this node's work elsewhere and tells it to exit 0. A stop of the whole job
    // (every instance signalled, the head too) ends the job with INTERRUPTED, as the head decides.
    spdlog::warn(
        "{}: asking the head to let this node leave (a drain, unless the whole job is "
        "being stopped)",
        reason);
    node_.leaving();
    auto req = node_.cluster().leaveRequest();
    req.setNodeId(nodeId_);
    req.setReason(reason);
    node_.tasks().add(req.send().ignoreResult());
    // The head answers with Node.exit(); if it does not, leave anyway.
    auto& o = node_.options();
    auto limit = (kDrainWindowMs + o.stopTimeoutMs + o.headTimeoutMs) * kj::MILLISECONDS;
    node_.tasks().add(node_.loop().timer().afterDelay(limit).then([this, reason]() {
      node_.requestExit(INTERRUPTED, reason + "; the head did not answer in time");
    }));
  }

  NodeRuntime& node_;
  struct ForgetStallNote {  // the node may outlive this worker: it stops asking it then
    NodeRuntime& node;
    ~ForgetStallNote() { node.setStallNote(nullptr); }
  } forgetStallNote_{node_};
  std::string headAddress_;
  kj::TimePoint deadline_;
  kj::Duration backoff_ = 100 * kj::MILLISECONDS;
  // Since when every connect has been refused (none: the last one was not), and whether any
  // attempt got further than a refusal.
  std::optional<kj::TimePoint> refusedSince_;
  bool reached_ = false;
  kj::Own<Connection> headConnection_;
  std::unique_ptr<ControlClient> control_;  // from the join on
  uint32_t nodeId_ = 0;
  bool signalled_ = false;
};

Worker::Worker(NodeRuntime& node) : impl_(kj::heap<Impl>(node)) {}
Worker::~Worker() noexcept(false) {}
void Worker::start() {
  impl_->start();
}
void Worker::stopControl() {
  impl_->stopControl();
}
void Worker::logControlPath() {
  impl_->logControlPath();
}

}  // namespace troupe
