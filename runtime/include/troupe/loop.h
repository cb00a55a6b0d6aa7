// File: troupe/loop.h
//
// One event loop per process: KJ's UnixEventPort (Cap'n Proto RPC, timers, sockets) with libuv
// embedded in it. libuv owns child processes (uv_spawn), signals (uv_signal) and the compute thread
// pool (uv_queue_work); KJ owns everything else. The bridge watches libuv's backend fd with a KJ
// FdObserver, turns uv_backend_timeout() into a KJ timer and runs uv_run(UV_RUN_NOWAIT) on each
// wake-up, so actor code only ever sees kj::Promise.
//
// Pitfalls this bridge handles, all seen on capnp 0.9.2 + libuv 1.44:
// - uv_backend_timeout() is 0 when libuv has nothing active: we sleep until kicked, not spin;
// - KJ's FdObserver is edge-triggered: the fd's level is checked before each wait;
// - the observer is destroyed before uv_loop_close();
// - after any libuv call made from KJ code, the pump must be kicked (kick()) to pick up new
// timeouts;
// - KJ's captureChildExit() and captureSignal() are never used: KJ's waitpid(-1) would steal
//   libuv's children, and a signal can have one owner only.

#pragma once

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/debug.h>
#include <kj/function.h>
#include <kj/refcount.h>
#include <kj/timer.h>
#include <kj/vector.h>
#include <uv.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe {

class WorkGroup {
  // Offloaded jobs that belong together (one actor's), counted from offload() until the job's
  // function has returned on its pool thread, or the job was cancelled before it started. Dropping
  // the promise offload() returned does not end a job that is already running, so an owner that
  // is about to destroy what its jobs touch waits for whenIdle() first (Seastar's rule: every
  // service's stop() waits for its work).
 public:
  WorkGroup();
  ~WorkGroup() noexcept(false);
  KJ_DISALLOW_COPY(WorkGroup);

  size_t running() const { return state_->running; }
  // Jobs offloaded through this group that have not finished running.
  kj::Promise<void> whenIdle();
  // Resolves once running() is 0 (at once if it is).

  void close(kj::StringPtr why);
  // Refuse further jobs: offload() through the group then rejects with a DISCONNECTED exception
  // carrying `why`. Jobs already queued or running are not affected.
  kj::Maybe<kj::StringPtr> closedBecause() const;

 private:
  friend class EventLoop;
  struct State : public kj::Refcounted {
    size_t running = 0;
    kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> idleWaiters;
    void finished();
  };
  kj::Own<State> state_;
  kj::Maybe<kj::String> closed_;
};

class EventLoop {
  // The process's event loop. Create exactly one, on the main thread, before anything async.
 public:
  explicit EventLoop(unsigned poolThreads = 0);
  // `poolThreads` sizes libuv's compute pool (0 = the number of online CPUs). libuv's pool is
  // process-wide and sized once, on first use: only the first EventLoop's value takes effect.
  ~EventLoop() noexcept(false);
  KJ_DISALLOW_COPY(EventLoop);

  kj::WaitScope& waitScope() { return io_.waitScope; }
  kj::AsyncIoProvider& io() { return *io_.provider; }
  kj::Timer& timer() { return io_.provider->getTimer(); }
  unsigned poolThreads() const { return poolThreads_; }

  uv_loop_t* uv() { return &uv_; }
  // The embedded libuv loop. Call kick() after starting anything on it from KJ code.

  void kick();
  // Wakes the pump so it recomputes libuv's timeout. Cheap; safe to call often.

  template <typename Fn>
  auto offload(Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn>>;
  // Runs `fn` on the compute pool and resolves on the loop thread with its result (or its
  // exception). Dropping the promise cancels work that has not started; work already running
  // finishes and its result is discarded, so `fn` must own (capture by value) what it touches.
  template <typename Fn>
  auto offload(WorkGroup& group, Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn>>;
  // The same, counted in `group` until `fn` has returned (see WorkGroup); rejects at once when
  // the group is closed.
  template <typename T, typename Fn>
  auto offloadInto(WorkGroup& group, kj::Own<T> target, Fn&& fn)
      -> kj::Promise<std::pair<kj::Own<T>, std::invoke_result_t<Fn, T&>>>;
  // Runs `fn(*target)` on the compute pool, for work that writes into memory a loop-thread
  // object owns (a batch built in place in its outgoing message), and resolves with `target` and
  // what `fn` returned. `target` is never destroyed while `fn` runs: dropping the promise leaves
  // it to the job, which releases it on the loop thread once `fn` has returned (or was cancelled
  // before it started). `fn` must not touch `target` beyond memory the loop thread leaves alone
  // meanwhile.

  void onSignal(int signum, kj::Function<void(int)> handler);
  // Calls `handler` on the loop thread each time `signum` arrives (through uv_signal). Then
  // unblocks `signum` in the calling thread: a signal that arrived while it was blocked (the
  // image's entry point, hold-signals, blocks SIGTERM and SIGINT from PID 1's first instruction)
  // is delivered now instead of lost; and one holdStopSignals() recorded is raised again.

  uint64_t pumpWakeups() const { return wakeups_; }
  // How many times the pump has woken. Tests use it to check that an idle loop does not spin.

 private:
  struct WorkBase;
  template <typename T>
  struct Work;
  template <typename T>
  class WorkAdapter;

  template <typename Fn>
  auto offloadCounted(WorkGroup::State* group, Fn&& fn, kj::Own<kj::Refcounted> keep = {})
      -> kj::Promise<std::invoke_result_t<Fn>>;
  template <typename T>
  struct Parked final : public kj::Refcounted {
    // offloadInto()'s target, shared by the job and the promise's continuation; both hold and
    // release it on the loop thread only.
    explicit Parked(kj::Own<T> target) : target(kj::mv(target)) {}
    kj::Own<T> target;
  };
  kj::Promise<void> pump();
  kj::Promise<void> waitForUv();
  void queue(WorkBase& work);

  kj::AsyncIoContext io_;
  uv_loop_t uv_;
  unsigned poolThreads_;
  kj::Own<kj::UnixEventPort::FdObserver> observer_;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> kicker_;
  kj::Promise<void> pumpTask_;
  std::vector<uv_signal_t*> signals_;
  uint64_t wakeups_ = 0;
};

// =======================================================================================
// Implementation details below.

struct EventLoop::WorkBase {
  // One uv_queue_work request. Owned by libuv from queue() until its after-work callback, which
  // calls finish() and deletes it.
  uv_work_t req;
  virtual ~WorkBase() noexcept(false) = default;
  virtual void run() = 0;               // on a pool thread
  virtual void finish(int status) = 0;  // on the loop thread
};

template <typename T>
struct EventLoop::Work final : public WorkBase {
  using Result = std::conditional_t<std::is_void_v<T>, kj::_::Void, T>;
  kj::Function<Result()> fn;
  kj::Maybe<Result> result;
  kj::Maybe<kj::Exception> error;
  WorkAdapter<T>* adapter = nullptr;  // null once the promise was dropped
  kj::Own<WorkGroup::State> group;    // null when not counted
  kj::Own<kj::Refcounted> keep;       // what fn writes into (offloadInto), released in finish()

  void run() override {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { result = fn(); })) {
      error = kj::mv(*e);
    }
  }
  void finish(int status) override {
    auto kept = kj::mv(keep);  // released here, on the loop thread, after fn returned
    if (group.get() != nullptr) group->finished();
    if (adapter == nullptr) return;  // abandoned: discard the result
    auto& f = adapter->fulfiller_;
    adapter->work_ = nullptr;
    adapter = nullptr;
    if (status == UV_ECANCELED) {
      f.reject(KJ_EXCEPTION(DISCONNECTED, "offloaded work was cancelled"));
    } else KJ_IF_MAYBE(e, error) {
      f.reject(kj::mv(*e));
    } else KJ_IF_MAYBE(r, result) {
      if constexpr (std::is_void_v<T>) {
        f.fulfill();
      } else {
        f.fulfill(kj::mv(*r));
      }
    }
  }
};

template <typename T>
class EventLoop::WorkAdapter {
  // Ties a Work to its promise: dropping the promise tries uv_cancel() and detaches the work.
 public:
  WorkAdapter(kj::PromiseFulfiller<T>& fulfiller, EventLoop& loop, Work<T>* work)
      : fulfiller_(fulfiller), work_(work) {
    work->adapter = this;
    loop.queue(*work);
  }
  ~WorkAdapter() {
    if (work_ != nullptr) {
      work_->adapter = nullptr;
      uv_cancel(reinterpret_cast<uv_req_t*>(&work_->req));
    }
  }

 private:
  friend struct Work<T>;
  kj::PromiseFulfiller<T>& fulfiller_;
  Work<T>* work_;
};

template <typename Fn>
auto EventLoop::offload(Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn>> {
  return offloadCounted(nullptr, kj::fwd<Fn>(fn));
}

template <typename Fn>
auto EventLoop::offload(WorkGroup& group, Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn>> {
  KJ_IF_MAYBE(why, group.closedBecause()) {
    return KJ_EXCEPTION(DISCONNECTED, *why);
  }
  return offloadCounted(group.state_.get(), kj::fwd<Fn>(fn));
}

template <typename T, typename Fn>
auto EventLoop::offloadInto(WorkGroup& group, kj::Own<T> target, Fn&& fn)
    -> kj::Promise<std::pair<kj::Own<T>, std::invoke_result_t<Fn, T&>>> {
  using R = std::invoke_result_t<Fn, T&>;
  static_assert(!std::is_void_v<R>, "offloadInto: let fn return a value (its CPU time, say)");
  KJ_IF_MAYBE(why, group.closedBecause()) {
    return KJ_EXCEPTION(DISCONNECTED, *why);
  }
  auto parked = kj::refcounted<Parked<T>>(kj::mv(target));
  T* raw = parked->target.get();
  auto job = offloadCounted(
      group.state_.get(), [raw, fn = kj::fwd<Fn>(fn)]() mutable { return fn(*raw); },
      kj::addRef(*parked));
  return job.then([parked = kj::mv(parked)](R result) mutable {
    return std::make_pair(kj::mv(parked->target), kj::mv(result));
  });
}

template <typename Fn>
auto EventLoop::offloadCounted(WorkGroup::State* group, Fn&& fn, kj::Own<kj::Refcounted> keep)
    -> kj::Promise<std::invoke_result_t<Fn>> {
  using T = std::invoke_result_t<Fn>;
  auto work = new Work<T>();
  work->keep = kj::mv(keep);
  if constexpr (std::is_void_v<T>) {
    work->fn = [f = kj::fwd<Fn>(fn)]() mutable {
      f();
      return kj::_::Void();
    };
  } else {
    work->fn = kj::fwd<Fn>(fn);
  }
  if (group != nullptr) {
    ++group->running;
    work->group = kj::addRef(*group);
  }
  return kj::newAdaptedPromise<T, WorkAdapter<T>>(*this, work);
}

void holdStopSignals();
// From now until EventLoop::onSignal takes them, SIGTERM and SIGINT are recorded instead of
// acted on, then handed to the handler onSignal installs. troupe::run() does this from the
// program's static initialisation on (run.cpp): a stop in an app's first half second, before its
// node is up, still ends the job as INTERRUPTED with a failure file, and as PID 1 of a PID
// namespace (a container) it is not dropped by the kernel, which ignores a signal that init has
// no handler for. A signal that was being ignored (SIG_IGN) stays ignored. Unblocks both: one
// that was blocked and pending is recorded at once.
void blockStopSignalsForExec();
// For a program that execs itself before troupe::run() (hetero_train does, for OpenMP's
// settings): blocks SIGTERM and SIGINT and makes a recorded one pending again, so that it
// survives the exec (the mask and pending signals do, handlers and memory do not) and the new
// image records it. Unblocks nothing: call it right before execve.
void releaseStopSignals();
// Gives SIGTERM and SIGINT back their default action and raises one that was recorded: for a
// program that links troupe::run() without being an app (the `troupe` tool).

}  // namespace troupe
