// The control path (control.h): the control thread and the head's server; a worker's client is
// in control_client.cpp.
#include "control/control.h"

#include <capnp/message.h>
#include <capnp/serialize-async.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "control/control_wire.h"
#include "net/login_places.h"
#include "net/secure.h"
#include "troupe.capnp.h"
#include "troupe/config.h"

namespace troupe {

using control_wire::Clock;
using control_wire::msBetween;

bool tokensEqual(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b);  // node.cpp

namespace {

// "10.0.0.1:7000" -> "10.0.0.1:<port>"; "[::1]:7000" -> "[::1]:<port>".
std::string withPort(const std::string& address, uint16_t port) {
  auto colon = address.rfind(':');
  return (colon == std::string::npos ? address : address.substr(0, colon)) + ":" +
         std::to_string(port);
}

}  // namespace

std::string controlAddress(const std::string& headAddress, uint16_t port) {
  return withPort(headAddress, port);
}

ControlSettings ControlSettings::from(const RunOptions& o, JobTls* tls) {
  ControlSettings s;
  s.tls = tls;
  s.heartbeatMs = o.heartbeatMs;
  s.nodeTimeoutMs = o.nodeTimeoutMs;
  s.nodeTimeoutMaxMs = o.nodeTimeoutMaxMs == 0 ? 2 * o.nodeTimeoutMs : o.nodeTimeoutMaxMs;
  s.headTimeoutMs = o.headTimeoutMs;
  s.loginTimeoutMs = o.loginTimeoutMs;
  s.maxUnauthenticated = o.maxUnauthenticated;
  s.secret = o.token;
  s.insecure = o.insecure;
  return s;
}

PhiDetector::Settings ControlSettings::detector() const {
  PhiDetector::Settings d;
  d.heartbeatMs = heartbeatMs;
  d.acceptablePauseMs = double(nodeTimeoutMs) - heartbeatMs;
  d.minStdDevMs = std::max(20.0, heartbeatMs / 5.0);
  d.maxSilenceMs = nodeTimeoutMaxMs;
  return d;
}

// =======================================================================================
// ControlThread

ControlThread::~ControlThread() { stop(); }

void ControlThread::start() {
  thread_ = std::thread([this]() { main(); });
  std::unique_lock<std::mutex> lock(mutex_);
  started_.wait(lock, [this]() { return ready_; });
  if (!startError_.empty()) {
    lock.unlock();
    thread_.join();
    throw ConfigError(startError_);
  }
}

namespace {

// The control thread ahead of the node's own work: it runs a few microseconds every heartbeat, and
// a node whose augmenters keep every CPU busy (as they should) must still answer on time. A
// real-time priority (SCHED_RR 1) runs it as soon as its timer fires, whatever the CPUs' load and
// the cgroups' weights; where that is not allowed (no CAP_SYS_NICE, or a kernel with real-time
// group scheduling and no real-time budget for the cgroup), nice -10, then the default. Not
// inherited by anything it starts (SCHED_RESET_ON_FORK). TROUPE_CONTROL_PRIORITY=normal leaves
// it at the default.
std::string raisePriority() {
  const char* asked = getenv("TROUPE_CONTROL_PRIORITY");
  if (asked != nullptr && std::string(asked) == "normal") {
    return "the default (TROUPE_CONTROL_PRIORITY=normal)";
  }
  sched_param rr{};
  rr.sched_priority = 1;
  if (sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &rr) == 0) {
    return "real-time (SCHED_RR 1)";
  }
  std::string why = std::strerror(errno);
  if (setpriority(PRIO_PROCESS, gettid(), -10) == 0) {
    return "nice -10 (SCHED_RR refused: " + why + ")";
  }
  return "the default (SCHED_RR and nice -10 refused: " + why + ")";
}

}  // namespace

void ControlThread::main() {
  // Signals belong to the main loop (libuv's handlers, the stop cascade): none is delivered here.
  sigset_t all;
  sigfillset(&all);
  for (int sync : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigdelset(&all, sync);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pthread_setname_np(pthread_self(), "troupe-control");
  spdlog::debug("control thread: priority {}", raisePriority());

  auto io = kj::setupAsyncIo();
  auto paf = kj::newPromiseAndFulfiller<void>();
  kj::Maybe<kj::Promise<void>> work;
  std::string error;
  try {
    work = serve(io);
  } catch (const std::exception& e) {
    error = e.what();
  } catch (kj::Exception& e) {
    error = e.getDescription().cStr();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error.empty()) {
      executor_ = &kj::getCurrentThreadExecutor();
      stopFulfiller_ = paf.fulfiller.get();
    } else {
      startError_ = error;
    }
    ready_ = true;
  }
  started_.notify_all();
  if (!error.empty()) return;
  try {
    KJ_ASSERT_NONNULL(work).exclusiveJoin(kj::mv(paf.promise)).wait(io.waitScope);
  } catch (kj::Exception& e) {
    spdlog::error("the control thread failed: {}; liveness is no longer judged on this node",
                  e.getDescription().cStr());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  executor_ = nullptr;
  stopFulfiller_ = nullptr;
}

void ControlThread::stop() {
  if (!thread_.joinable()) return;
  const kj::Executor* executor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    executor = executor_;
  }
  if (executor != nullptr) {
    try {
      executor->executeSync([this]() {
        if (stopFulfiller_ != nullptr) {
          static_cast<kj::PromiseFulfiller<void>*>(stopFulfiller_)->fulfill();
        }
      });
    } catch (kj::Exception&) {
      // Its loop already ended.
    }
  }
  thread_.join();
}

// =======================================================================================
// ControlServer: the head's side

ControlServer::ControlServer(ControlSettings settings, const std::string& host, uint16_t port)
    : ControlThread(std::move(settings)), host_(host), port_(port) {
  start();
}

ControlServer::~ControlServer() { stop(); }

double ControlServer::nowMs() const {
  return std::chrono::duration<double, std::milli>(Clock::now() - epoch_).count();
}

void ControlServer::admit(uint32_t nodeId, std::string host) {
  std::lock_guard<std::mutex> lock(mutex_);
  peers_.erase(nodeId);
  peers_.emplace(nodeId, Peer{std::move(host), PhiDetector(settings_.detector(), nowMs())});
}

void ControlServer::fence(uint32_t nodeId, std::string why) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(nodeId);
  if (it != peers_.end() && it->second.fencedWhy.empty()) it->second.fencedWhy = std::move(why);
}

std::vector<ControlServer::Lost> ControlServer::takeLost() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(lost_, {});
}

std::optional<int64_t> ControlServer::silenceMs(uint32_t nodeId) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(nodeId);
  if (it == peers_.end() || !it->second.fencedWhy.empty()) return std::nullopt;
  return int64_t(it->second.detector.silenceMs(nowMs()));
}

namespace {

struct ServerState {
  // What the head's control thread owns; destroyed on it.
  kj::Own<kj::ConnectionReceiver> listener;
  kj::Own<JobTls> ownTls;
  JobTls* tls = nullptr;
  // Connections that have not said hello yet: before the tasks that hold their places, so
  // destroyed after them.
  LoginPlaces unauthenticated;
  kj::TaskSet tasks;
  std::map<uint32_t, SteadyTime> refused;  // node id -> when a refusal was last logged
  SteadyTime capLogged{};                  // when a connection over the cap was last logged
  ServerState(kj::TaskSet::ErrorHandler& handler, unsigned maxUnauthenticated)
      : unauthenticated(maxUnauthenticated), tasks(handler) {}
};

// A connection's place among those that have not said hello yet, until release() or its end.
using Unauthenticated = LoginPlaces::Place;

struct LogErrors final : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("control connection ended: {}", e.getDescription().cStr());
  }
};

}  // namespace

kj::Promise<void> ControlServer::serve(kj::AsyncIoContext& io) {
  static LogErrors errors;
  auto state = kj::heap<ServerState>(errors, settings_.maxUnauthenticated);
  auto address = io.provider->getNetwork().parseAddress(host_, port_).wait(io.waitScope);
  try {
    state->listener = address->listen();
  } catch (kj::Exception& e) {
    throw ConfigError("cannot listen for the control path on " + host_ + ":" +
                      std::to_string(port_) + " (" + e.getDescription().cStr() +
                      "); free the port or choose another with --control-port");
  }
  port_ = state->listener->getPort();
  if (!settings_.insecure) {
    state->tls = settings_.tls;
    if (state->tls == nullptr) {
      state->ownTls = kj::heap<JobTls>(settings_.secret);
      state->tls = state->ownTls.get();
    }
  }
  auto& timer = io.provider->getTimer();
  auto& s = *state;

  // One connection: (TLS,) a hello naming the node, then heartbeats, each answered at once.
  auto serveOne = [this, &timer, &s](kj::Own<kj::AsyncIoStream> raw,
                                     kj::Own<Unauthenticated> slot) -> kj::Promise<void> {
    auto& pending = *slot;
    return control_wire::wrap(timer, s.tls, kj::mv(raw), true, settings_.loginTimeoutMs)
        .then([this, &timer, &s, &pending](kj::Own<kj::AsyncIoStream> stream) {
          auto& ref = *stream;
          return timer
              .timeoutAfter(settings_.loginTimeoutMs * kj::MILLISECONDS,
                            capnp::readMessage(ref, control_wire::readerOptions()))
              .then([this, &ref, &s, &pending](
                        kj::Own<capnp::MessageReader> message) -> kj::Promise<void> {
                pending.release();
                auto hello = message->getRoot<proto::ControlHello>();
                uint32_t nodeId = hello.getNodeId();
                if (settings_.insecure &&
                    !tokensEqual(hello.getToken(),
                                 kj::StringPtr(settings_.secret.c_str()).asBytes())) {
                  // A misconfigured node retries every heartbeat: say it once in 10 s.
                  auto now = Clock::now();
                  auto last = s.refused.find(nodeId);
                  if (last == s.refused.end() || now - last->second > std::chrono::seconds(10)) {
                    spdlog::warn("control path: refused a connection claiming node {} (wrong "
                                 "token); is it started with another job secret?",
                                 nodeId);
                    s.refused[nodeId] = now;
                  }
                  return kj::READY_NOW;
                }
                // Heartbeats until the connection ends.
                struct Loop {
                  ControlServer& server;
                  kj::AsyncIoStream& stream;
                  uint32_t nodeId;
                  kj::Promise<void> next() {
                    return capnp::readMessage(stream, control_wire::readerOptions())
                        .then([this](kj::Own<capnp::MessageReader> message) {
                          auto beat = message->getRoot<proto::ControlBeat>();
                          auto ack = kj::heap<capnp::MallocMessageBuilder>(64);
                          auto a = ack->initRoot<proto::ControlAck>();
                          a.setSeq(beat.getSeq());
                          {
                            std::lock_guard<std::mutex> lock(server.mutex_);
                            auto it = server.peers_.find(nodeId);
                            if (it == server.peers_.end()) {
                              a.setFenced(true);
                              a.setReason("node id " + std::to_string(nodeId) +
                                          " is unknown to the head");
                            } else if (!it->second.fencedWhy.empty()) {
                              a.setFenced(true);
                              a.setReason(it->second.fencedWhy);
                            } else {
                              auto& peer = it->second;
                              if (peer.heard) {
                                peer.detector.heartbeat(server.nowMs());
                              } else {
                                // The wait since joining is no gap between heartbeats.
                                peer.detector =
                                    PhiDetector(server.settings_.detector(), server.nowMs());
                                peer.heard = true;
                              }
                            }
                          }
                          auto& out = *ack;
                          return capnp::writeMessage(stream, out).attach(kj::mv(ack));
                        })
                        .then([this]() { return next(); });
                  }
                };
                auto loop = kj::heap<Loop>(Loop{*this, ref, nodeId});
                auto& l = *loop;
                return l.next().attach(kj::mv(loop));
              })
              .attach(kj::mv(stream));
        })
        .attach(kj::mv(slot));
  };

  struct Acceptor {
    kj::ConnectionReceiver& listener;
    ServerState& state;
    kj::Function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>, kj::Own<Unauthenticated>)> serveOne;
    kj::Promise<void> next() {
      return listener.accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
        std::string full;
        auto slot = state.unauthenticated.take(peerName(*stream), full);
        if (slot.get() == nullptr) {
          // Closed at once: strangers cannot hold more of this thread's descriptors.
          auto now = Clock::now();
          if (now - state.capLogged > std::chrono::seconds(10)) {
            spdlog::warn("control path: closed a connection at once: {}", full);
            state.capLogged = now;
          }
          return next();
        }
        state.tasks.add(serveOne(kj::mv(stream), kj::mv(slot)));
        return next();
      });
    }
  };
  auto acceptor = kj::heap<Acceptor>(
      Acceptor{*s.listener, s, kj::mv(serveOne)});
  auto& a = *acceptor;
  return a.next().exclusiveJoin(judge(timer)).attach(kj::mv(acceptor), kj::mv(state));
}

kj::Promise<void> ControlServer::judge(kj::Timer& timer) {
  // Every tenth of a heartbeat interval (at most 100 ms): credit this thread's own lateness to
  // every node, then declare lost whoever the detector says is.
  auto every = std::min(100u, std::max(10u, settings_.heartbeatMs / 5));
  auto expected = nowMs() + every;
  return timer.afterDelay(every * kj::MILLISECONDS).then([this, &timer, expected]() {
    double now = nowMs();
    double late = now - expected;
    std::vector<std::pair<uint32_t, std::string>> declared;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (late > 0) {
        for (auto& [id, p] : peers_) p.detector.credit(late);
      }
      for (auto& [id, p] : peers_) {
        if (!p.fencedWhy.empty() || p.lost) continue;
        if (p.heard ? !p.detector.lost(now)
                    : p.detector.silenceMs(now) < settings_.firstContactMs()) {
          continue;
        }
        p.lost = true;
        p.fencedWhy = p.heard ? p.detector.verdict(now)
                              : "no heartbeat on the control path within " +
                                    std::to_string(settings_.firstContactMs()) +
                                    " ms of joining (can it reach the head's control port " +
                                    std::to_string(port_) + "? --control-port fixes it)";
        lost_.push_back({id, p.fencedWhy});
        declared.push_back({id, p.fencedWhy});
      }
    }
    // What held this thread back (throttle.h), read on this thread only: marked once a
    // heartbeat interval, not every tick, and read out after a stall.
    if (late > settings_.heartbeatMs) {
      spdlog::warn("the head's control thread stalled for {:.0f} ms; not counted against the "
                   "workers{}",
                   late, throttleNote(throttle_.since(), int64_t(late)));
    }
    if (late > settings_.heartbeatMs || now - throttleMarkedMs_ >= settings_.heartbeatMs) {
      throttle_.mark();
      throttleMarkedMs_ = now;
    }
    for (auto& [id, why] : declared) {
      spdlog::debug("control path: node {} is lost: {}", id, why);
    }
    return judge(timer);
  });
}

}  // namespace troupe
