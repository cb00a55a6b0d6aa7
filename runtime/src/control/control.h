// The control path: liveness on a thread and a connection of its own (docs/lifecycle.md, "The
// control path"; DESIGN.md 6a).
//
// Every node process runs one control thread with its own KJ event loop. A worker's thread keeps
// one TCP connection (TLS as every connection, or the token with --insecure) to the head's thread
// and sends a heartbeat on it every --heartbeat-ms; the head's thread answers each at once and
// judges every worker's silence with a phi-accrual detector (detector.h). No actor method, pool
// backlog or bulk batch can queue ahead of either: they run on the node's main loop and its RPC
// connections, which this path shares nothing with but the process. A node is alive while its
// process runs and its control thread is scheduled.
//
// The main loop and the control thread share only what the classes below guard with a mutex: the
// head's thread decides who is lost and the head's loop, when it next runs, fences them; a
// worker's loop reads when the head last answered and whether it said "fenced".

#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kj/async-io.h>

#include "control/detector.h"
#include "control/throttle.h"
#include "net/secure.h"
#include "troupe/run_options.h"

namespace troupe {

struct ControlSettings {
  unsigned heartbeatMs = 500;
  unsigned nodeTimeoutMs = 3000;     // silence any link may show (the detector's acceptable pause
                                     // plus one heartbeat)
  unsigned nodeTimeoutMaxMs = 6000;  // the hard bound for a node that sends nothing
  unsigned headTimeoutMs = 5000;
  unsigned loginTimeoutMs = 5000;     // TLS handshake and hello, each
  unsigned maxUnauthenticated = 64;  // connections before their hello; more are closed at once
  std::string secret;  // the job secret: TLS keys, or the token itself with --insecure
  bool insecure = false;
  JobTls* tls = nullptr;  // the node's (its SSL_CTX serves any thread); null: derive one
  unsigned firstContactMs() const { return 2 * nodeTimeoutMaxMs; }
  // How long a node that joined may take to send its first heartbeat on this path before the
  // head declares it lost: formation of hundreds of nodes on a few cores takes seconds. (A worker
  // waits for the head's first answer only --head-timeout-ms from its join, as for any other.)

  PhiDetector::Settings detector() const;
  static ControlSettings from(const RunOptions& options, JobTls* tls);
};

using SteadyTime = std::chrono::steady_clock::time_point;

std::string controlAddress(const std::string& headAddress, uint16_t port);
// Where the head's control thread listens: the host of its RPC address `headAddress` ("ip:port")
// with the control port it announced at join.

class ControlThread {
  // The thread and its event loop; the classes below give it its work.
 public:
  virtual ~ControlThread();

 protected:
  explicit ControlThread(ControlSettings settings) : settings_(std::move(settings)) {}
  void start();
  // Runs serve() on a new thread; returns once it has started (or failed to: then throws
  // ConfigError with what serve() threw before its first wait).
  void stop();
  // Ends serve() and joins the thread (idempotent; the destructor calls it).
  virtual kj::Promise<void> serve(kj::AsyncIoContext& io) = 0;
  // On the control thread: sets up (what it throws, start() throws) and returns the work, which
  // runs until stop().

  const ControlSettings settings_;

 private:
  void main();

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable started_;
  bool ready_ = false;
  std::string startError_;
  const kj::Executor* executor_ = nullptr;
  void* stopFulfiller_ = nullptr;  // kj::PromiseFulfiller<void>*, on the control thread
};

class ControlServer final : public ControlThread {
  // The head's side: listens, answers heartbeats, judges silence.
 public:
  ControlServer(ControlSettings settings, const std::string& host, uint16_t port);
  // Binds host:port (0: any free port) and starts the thread. Throws ConfigError naming the
  // address when it cannot bind.
  ~ControlServer() override;

  uint16_t port() const { return port_; }
  void admit(uint32_t nodeId, std::string host);
  // The node joined: its silence counts from now, on this path.
  void fence(uint32_t nodeId, std::string why);
  // The head declared it lost (for whatever reason): its heartbeats are answered "fenced".
  struct Lost {
    uint32_t nodeId;
    std::string why;
  };
  std::vector<Lost> takeLost();
  // The nodes the detector declared lost since the last call, each once (they are fenced here).
  std::optional<int64_t> silenceMs(uint32_t nodeId);
  // Since its last heartbeat on this path (none for an unknown or fenced node).

 private:
  struct Peer {
    std::string host;
    PhiDetector detector;
    bool heard = false;      // a heartbeat has arrived on this path
    bool lost = false;       // declared by the detector, not yet taken by the head
    std::string fencedWhy;   // non-empty: answer "fenced"
  };
  kj::Promise<void> serve(kj::AsyncIoContext& io) override;
  kj::Promise<void> judge(kj::Timer& timer);
  double nowMs() const;

  std::string host_;
  uint16_t port_;
  ThrottleWatch throttle_;  // the judge's, on the control thread
  double throttleMarkedMs_ = 0;
  SteadyTime epoch_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::map<uint32_t, Peer> peers_;
  std::vector<Lost> lost_;
};

class ControlClient final : public ControlThread {
  // A worker's side: heartbeats to the head, and what the head answers.
 public:
  ControlClient(ControlSettings settings, std::string headAddress, uint32_t nodeId);
  // `headAddress`: "host:port" of the head's control listener.
  ~ControlClient() override;

  int64_t sinceHeardMs();
  // Since the head last answered on this path, less this thread's own stalls (or since start).
  std::optional<std::string> fenced();
  bool answered();
  // The head has answered at least once on this path.
  // The head answered "fenced": why it declared this node lost.
  int64_t frozenMs();
  std::string frozenNote();
  // What held that stall back, when a cgroup's CPU quota did (throttle.h): "; its cgroup's ..." or
  // "".
  std::string stallNote();
  // Its longest stall past a heartbeat interval within the last minute, and what held it back:
  // "; its control thread stalled N ms, M ms before this (...)", or "". For a node the head
  // fenced, which may have thawed before it read the head's answer.
  std::string roundTrips();
  // "N heartbeats answered, round trip p50 X ms, p99 Y ms, max Z ms" (the last 10,000).
  // This thread's last stall past the node timeout (the head has fenced this node, unless it
  // answers a heartbeat sent after it as usual); 0 when none or cleared.

 private:
  kj::Promise<void> serve(kj::AsyncIoContext& io) override;

  std::string headAddress_;
  uint32_t nodeId_;
  std::mutex mutex_;
  SteadyTime lastHeard_ = std::chrono::steady_clock::now();
  std::optional<std::string> fenced_;
  int64_t frozenMs_ = 0;
  ThrottleWatch throttle_;            // marked at every heartbeat round
  ThrottleWatch::Held frozenHeld_;  // what the quota held of the stall frozenMs_ says
  SteadyTime thawedAt_{};
  int64_t stallMs_ = 0;             // the longest recent stall past a heartbeat interval
  ThrottleWatch::Held stallHeld_;
  SteadyTime stallAt_{};
  SteadyTime nextBeat_ = SteadyTime::max();
  std::vector<float> roundTripsMs_;  // a ring of the last 10,000
  uint64_t answered_ = 0;  // when the beat timer is due; max while not waiting
};

}  // namespace troupe
