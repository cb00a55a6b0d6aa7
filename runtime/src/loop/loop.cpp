#include "troupe/loop.h"
#include "troupe/trace.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <kj/debug.h>

namespace troupe {

namespace {

unsigned onlineCpus() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

bool fdIsReadable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

}  // namespace

// =======================================================================================
// WorkGroup

WorkGroup::WorkGroup() : state_(kj::refcounted<State>()) {}

WorkGroup::~WorkGroup() noexcept(false) {
  // Jobs still running keep the state alive; nobody is waiting for them any more.
  state_->idleWaiters.clear();
}

kj::Promise<void> WorkGroup::whenIdle() {
  if (state_->running == 0) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  state_->idleWaiters.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void WorkGroup::close(kj::StringPtr why) {
  if (closed_ == nullptr) closed_ = kj::str(why);
}

kj::Maybe<kj::StringPtr> WorkGroup::closedBecause() const {
  KJ_IF_MAYBE(why, closed_) {
    return kj::StringPtr(*why);
  }
  return nullptr;
}

void WorkGroup::State::finished() {
  KJ_ASSERT(running > 0);
  if (--running > 0) return;
  auto waiters = kj::mv(idleWaiters);
  for (auto& w : waiters) w->fulfill();
}

// =======================================================================================
// EventLoop

EventLoop::EventLoop(unsigned poolThreads)
    : io_(kj::setupAsyncIo()),
      poolThreads_(poolThreads == 0 ? onlineCpus() : poolThreads),
      pumpTask_(nullptr) {
  // libuv reads UV_THREADPOOL_SIZE once, when the pool first starts. An explicit setting by the
  // user wins.
  setenv("UV_THREADPOOL_SIZE", std::to_string(poolThreads_).c_str(), 0);
  // A write to a closed socket must be an error on that connection, not the end of the process.
  signal(SIGPIPE, SIG_IGN);
  // Check the OS for I/O and timers every 256 events even when work never runs out: a saturated
  // loop (pipelined calls) would otherwise starve heartbeats and timers until the node is declared
  // lost.
  io_.waitScope.setBusyPollInterval(256);
  KJ_REQUIRE(uv_loop_init(&uv_) == 0, "uv_loop_init failed");
  observer_ = kj::heap<kj::UnixEventPort::FdObserver>(io_.unixEventPort, uv_backend_fd(&uv_),
                                                      kj::UnixEventPort::FdObserver::OBSERVE_READ);
  pumpTask_ = pump().eagerlyEvaluate([](kj::Exception&& e) {
    KJ_LOG(FATAL, "libuv pump failed", e);
    abort();
  });
}

EventLoop::~EventLoop() noexcept(false) {
  pumpTask_ = nullptr;
  kicker_ = nullptr;
  for (auto* s : signals_) {
    uv_close(reinterpret_cast<uv_handle_t*>(s), [](uv_handle_t* h) {
      delete static_cast<kj::Function<void(int)>*>(h->data);
      delete reinterpret_cast<uv_signal_t*>(h);
    });
  }
  signals_.clear();
  // Let close callbacks and pending pool work finish; offloaded work still running must end
  // before the loop can close.
  while (uv_run(&uv_, UV_RUN_NOWAIT) != 0) {
    usleep(1000);
  }
  observer_ = nullptr;  // before uv_loop_close(): it watches libuv's fd
  uv_loop_close(&uv_);
}

void EventLoop::kick() {
  KJ_IF_MAYBE(k, kicker_) {
    (*k)->fulfill();
    kicker_ = nullptr;
  }
}

kj::Promise<void> EventLoop::pump() {
  return waitForUv().then([this]() {
    ++wakeups_;
    uv_run(&uv_, UV_RUN_NOWAIT);
    return pump();
  });
}

kj::Promise<void> EventLoop::waitForUv() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  kicker_ = kj::mv(paf.fulfiller);
  if (!uv_loop_alive(&uv_)) {
    // Nothing active: uv_backend_timeout() would say 0. Sleep until someone starts something.
    return kj::mv(paf.promise);
  }
  if (fdIsReadable(uv_backend_fd(&uv_))) {
    // The observer is edge-triggered: an event that arrived while nobody waited is only visible
    // as the fd's level.
    return kj::evalLater([]() {});
  }
  auto woken = observer_->whenBecomesReadable().exclusiveJoin(kj::mv(paf.promise));
  int timeoutMs = uv_backend_timeout(&uv_);
  if (timeoutMs >= 0) {
    woken = woken.exclusiveJoin(timer().afterDelay(timeoutMs * kj::MILLISECONDS));
  }
  return woken;
}

void EventLoop::queue(WorkBase& work) {
  work.req.data = &work;
  int rc = uv_queue_work(
      &uv_, &work.req,
      [](uv_work_t* req) {
        trace::Span span("pool work", "pool");
        static_cast<WorkBase*>(req->data)->run();
      },
      [](uv_work_t* req, int status) {
        auto* w = static_cast<WorkBase*>(req->data);
        w->finish(status);
        delete w;
      });
  KJ_REQUIRE(rc == 0, "uv_queue_work failed", uv_strerror(rc));
  kick();
}

namespace {

std::atomic<int> recordedStop[2] = {0, 0};  // SIGTERM's, SIGINT's: the signal, once it came
std::atomic<bool> holding{false};

int stopIndex(int signum) {
  return signum == SIGTERM ? 0 : signum == SIGINT ? 1 : -1;
}

sigset_t stopSignals() {
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  return stops;
}

void recordStop(int signum) {
  int i = stopIndex(signum);
  if (i >= 0) recordedStop[i].store(signum);
}

}  // namespace

void holdStopSignals() {
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old{};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // nohup, a background job: stays ignored
    struct sigaction sa{};
    sa.sa_handler = recordStop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
  holding.store(true);
  // A stop held blocked until now (hold-signals, an exec by a program that blocked it first) is
  // recorded now.
  auto stops = stopSignals();
  pthread_sigmask(SIG_UNBLOCK, &stops, nullptr);
}

void blockStopSignalsForExec() {
  auto stops = stopSignals();
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  for (int sig : {SIGTERM, SIGINT}) {
    if (recordedStop[stopIndex(sig)].exchange(0) != 0) raise(sig);  // pending, blocked
  }
}

void releaseStopSignals() {
  if (!holding.exchange(false)) return;
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction now{};
    sigaction(sig, nullptr, &now);
    if (now.sa_handler != recordStop) continue;
    signal(sig, SIG_DFL);
    if (recordedStop[stopIndex(sig)].exchange(0) != 0) raise(sig);
  }
}

void EventLoop::onSignal(int signum, kj::Function<void(int)> handler) {
  auto* s = new uv_signal_t;
  uv_signal_init(&uv_, s);
  s->data = new kj::Function<void(int)>(kj::mv(handler));
  uv_signal_start(
      s, [](uv_signal_t* h, int sig) { (*static_cast<kj::Function<void(int)>*>(h->data))(sig); },
      signum);
  // The handle stays referenced: libuv only polls (and so only registers the signal pipe with
  // epoll) while the loop is alive.
  signals_.push_back(s);
  sigset_t held;
  sigemptyset(&held);
  sigaddset(&held, signum);
  KJ_REQUIRE(pthread_sigmask(SIG_UNBLOCK, &held, nullptr) == 0, "pthread_sigmask failed", signum);
  // A stop recordStop() kept since the program started: libuv's handler has it now.
  int i = stopIndex(signum);
  if (i >= 0 && recordedStop[i].exchange(0) != 0) raise(signum);
  kick();
}

}  // namespace troupe
