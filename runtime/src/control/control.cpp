// The control path (control.h): the control thread, the head's server and a worker's client.
#include "control/control.h"

#include <capnp/message.h>
#include <capnp/serialize-async.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

#include "net/login_places.h"
#include "net/secure.h"
#include "troupe.capnp.h"
#include "troupe/config.h"

namespace troupe {

bool tokensEqual(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b);  // node.cpp

namespace {

using Clock = std::chrono::steady_clock;

int64_t msBetween(SteadyTime from, SteadyTime to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

capnp::ReaderOptions controlReaderOptions() {
  // A control message is a few words: a stranger cannot make this thread buffer more.
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1024;
  o.nestingLimit = 8;
  return o;
}

void setNoDelay(kj::AsyncIoStream& stream) {
  int one = 1;
  stream.setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

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

namespace {

kj::Promise<kj::Own<kj::AsyncIoStream>> wrapControl(kj::Timer& timer, JobTls* tls,
                                                    kj::Own<kj::AsyncIoStream> stream, bool server,
                                                    unsigned timeoutMs) {
  setNoDelay(*stream);
  if (tls == nullptr) return kj::mv(stream);
  auto handshake = server ? tls->wrapServer(kj::mv(stream)) : tls->wrapClient(kj::mv(stream));
  return timer.timeoutAfter(timeoutMs * kj::MILLISECONDS, kj::mv(handshake));
}

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
    return wrapControl(timer, s.tls, kj::mv(raw), true, settings_.loginTimeoutMs)
        .then([this, &timer, &s, &pending](kj::Own<kj::AsyncIoStream> stream) {
          auto& ref = *stream;
          return timer
              .timeoutAfter(settings_.loginTimeoutMs * kj::MILLISECONDS,
                            capnp::readMessage(ref, controlReaderOptions()))
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
                    return capnp::readMessage(stream, controlReaderOptions())
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

// =======================================================================================
// ControlClient: a worker's side

ControlClient::ControlClient(ControlSettings settings, std::string headAddress, uint32_t nodeId)
    : ControlThread(std::move(settings)), headAddress_(std::move(headAddress)), nodeId_(nodeId) {
  start();
}

ControlClient::~ControlClient() { stop(); }

int64_t ControlClient::sinceHeardMs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return msBetween(lastHeard_, Clock::now());
}

bool ControlClient::answered() {
  std::lock_guard<std::mutex> lock(mutex_);
  return answered_ > 0;
}

std::optional<std::string> ControlClient::fenced() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fenced_;
}

int64_t ControlClient::frozenMs() {
  // Also a stall not over yet: read right after a thaw, before this thread's timer has run.
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, Clock::now());
  return std::max(frozenMs_, late > int64_t(settings_.nodeTimeoutMs) ? late : 0);
}

std::string ControlClient::frozenNote() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (frozenMs_ > 0) return throttleNote(frozenHeld_, frozenMs_);
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, Clock::now());
  return late > int64_t(settings_.nodeTimeoutMs) ? throttleNote(throttle_.since(), late) : "";
}

std::string ControlClient::stallNote() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  // A stall not over yet for this thread: thawed, its timer has not run (a fence read first).
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, now);
  if (late > int64_t(settings_.heartbeatMs)) {
    return "; this node's control thread is " + std::to_string(late) +
           " ms behind its heartbeats" + throttleNote(throttle_.since(), late);
  }
  auto ago = msBetween(stallAt_, now);
  if (stallMs_ == 0 || ago > 60000) return "";
  return "; this node's control thread had stalled " + std::to_string(stallMs_) + " ms, " +
         std::to_string(ago) + " ms before" + throttleNote(stallHeld_, stallMs_);
}

std::string ControlClient::roundTrips() {
  std::vector<float> ms;
  uint64_t answered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ms = roundTripsMs_;
    answered = answered_;
  }
  if (ms.empty()) return "no heartbeat answered";
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, size_t(q * ms.size()))]; };
  char text[160];
  std::snprintf(text, sizeof text,
                "%llu heartbeats answered, round trip p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                (unsigned long long)answered, at(0.5), at(0.99), ms.back());
  return text;
}

kj::Promise<void> ControlClient::serve(kj::AsyncIoContext& io) {
  struct Session {
    ControlClient& client;
    kj::AsyncIoContext& io;
    kj::Own<JobTls> ownTls;
    JobTls* tls = nullptr;
    uint64_t seq = 0;
    std::map<uint64_t, SteadyTime> sent;  // beats not answered yet
    kj::Duration backoff = 100 * kj::MILLISECONDS;

    kj::Promise<void> connect() {
      auto& s = client.settings_;
      return io.provider->getNetwork()
          .parseAddress(client.headAddress_)
          .then([](kj::Own<kj::NetworkAddress> address) {
            return address->connect().attach(kj::mv(address));
          })
          .then([this, &s](kj::Own<kj::AsyncIoStream> stream) {
            return wrapControl(io.provider->getTimer(), tls, kj::mv(stream), false,
                               s.loginTimeoutMs);
          })
          .then([this, &s](kj::Own<kj::AsyncIoStream> stream) {
            auto hello = kj::heap<capnp::MallocMessageBuilder>(64);
            auto h = hello->initRoot<proto::ControlHello>();
            h.setNodeId(client.nodeId_);
            if (s.insecure) h.setToken(kj::StringPtr(s.secret.c_str()).asBytes());
            auto& ref = *stream;
            auto& out = *hello;
            return capnp::writeMessage(ref, out)
                .attach(kj::mv(hello))
                .then([this, &ref]() {
                  backoff = 100 * kj::MILLISECONDS;
                  sent.clear();
                  // The first heartbeat at once: a node is heard within a round trip of joining.
                  return beat(ref, 0).exclusiveJoin(read(ref));
                })
                .attach(kj::mv(stream));
          })
          .catch_([this](kj::Exception&& e) {
            spdlog::debug("control path to the head {}: {}; reconnecting", client.headAddress_,
                          e.getDescription().cStr());
            auto delay = backoff;
            backoff = kj::min(backoff * 2, client.settings_.heartbeatMs * kj::MILLISECONDS);
            return io.provider->getTimer().afterDelay(delay).then([this]() { return connect(); });
          });
    }

    kj::Promise<void> beat(kj::AsyncIoStream& stream, unsigned every) {
      auto expected = Clock::now() + std::chrono::milliseconds(every);
      {
        std::lock_guard<std::mutex> lock(client.mutex_);
        client.nextBeat_ = expected;
      }
      return io.provider->getTimer()
          .afterDelay(every * kj::MILLISECONDS)
          .then([this, &stream, expected]() {
            auto now = Clock::now();
            int64_t late = std::max<int64_t>(0, msBetween(expected, now));
            ThrottleWatch::Held held;
            {
              // However late this round runs is this thread's own stall (the process was frozen
              // or starved): the head's answers may be waiting unread. It is not the head's
              // silence. Past the node timeout the head has fenced this node, unless an answer
              // to a heartbeat sent after the stall says otherwise.
              std::lock_guard<std::mutex> lock(client.mutex_);
              client.nextBeat_ = SteadyTime::max();  // not waiting on the timer while it writes
              client.lastHeard_ = std::min(now, client.lastHeard_ + std::chrono::milliseconds(late));
              held = client.throttle_.since();
              client.throttle_.mark();
              if (late > client.settings_.heartbeatMs &&
                  (late >= client.stallMs_ || now - client.stallAt_ > std::chrono::minutes(1))) {
                client.stallMs_ = late;
                client.stallHeld_ = held;
                client.stallAt_ = now;
              }
              if (late > client.settings_.nodeTimeoutMs) {
                client.frozenMs_ = late;
                client.frozenHeld_ = held;
                client.thawedAt_ = now;
              }
            }
            if (late > client.settings_.heartbeatMs) {
              spdlog::warn("this node's control thread stalled for {} ms{}", late,
                           throttleNote(held, late));
            }
            auto message = kj::heap<capnp::MallocMessageBuilder>(64);
            message->initRoot<proto::ControlBeat>().setSeq(++seq);
            sent[seq] = now;
            while (sent.size() > 1000) sent.erase(sent.begin());
            auto& out = *message;
            return capnp::writeMessage(stream, out).attach(kj::mv(message));
          })
          .then([this, &stream]() { return beat(stream, client.settings_.heartbeatMs); });
    }

    kj::Promise<void> read(kj::AsyncIoStream& stream) {
      return capnp::readMessage(stream, controlReaderOptions())
          .then([this, &stream](kj::Own<capnp::MessageReader> message) {
            auto ack = message->getRoot<proto::ControlAck>();
            auto now = Clock::now();
            auto it = sent.find(ack.getSeq());
            {
              std::lock_guard<std::mutex> lock(client.mutex_);
              client.lastHeard_ = now;
              if (client.answered_ == 0 && it == sent.end()) ++client.answered_;
              if (it != sent.end()) {
                float ms = std::chrono::duration<float, std::milli>(now - it->second).count();
                auto& ring = client.roundTripsMs_;
                if (ring.size() < 10000) {
                  ring.push_back(ms);
                } else {
                  ring[client.answered_ % ring.size()] = ms;
                }
                ++client.answered_;
              }
              if (ack.getFenced()) {
                if (!client.fenced_) client.fenced_ = std::string(ack.getReason().cStr());
              } else if (it != sent.end() && it->second >= client.thawedAt_) {
                client.frozenMs_ = 0;
              }
            }
            if (it != sent.end()) sent.erase(sent.begin(), std::next(it));
            return read(stream);
          });
    }
  };
  auto session = kj::heap<Session>(Session{*this, io, kj::Own<JobTls>()});
  if (!settings_.insecure) {
    session->tls = settings_.tls;
    if (session->tls == nullptr) {
      session->ownTls = kj::heap<JobTls>(settings_.secret);
      session->tls = session->ownTls.get();
    }
  }
  auto& s = *session;
  return s.connect().attach(kj::mv(session));
}

}  // namespace troupe
