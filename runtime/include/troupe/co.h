// Coroutines over kj::Promise for Cap'n Proto 0.9.2, which has none.
//
// A function returning `troupe::Co<T>` is a coroutine; a Co<T> converts to `kj::Promise<T>`:
//
//   troupe::Co<uint64_t> total(EventLoop& loop, troupe::Ref<Counter> counter) {
//     auto r = co_await counter.countRequest().send();  // any kj::Promise<U>, or a Co<U>
//     co_await loop.timer().afterDelay(kj::SECONDS);
//     co_return r.getCount();
//   }
//   kj::Promise<void> Trainer::train(TrainContext call) override { return trainCo(call); }
//
// Semantics follow KJ's own coroutines (Cap'n Proto 0.10 and later):
// - The body starts at once, on the caller's stack, and runs until its first `co_await`; it
//   resumes from the event loop, never from inside the caller.
// - A rejected promise throws its kj::Exception at the `co_await`; an exception leaving the body
//   rejects the coroutine's promise.
// - Dropping the coroutine's promise (or the Co) cancels it: the frame is destroyed (locals'
//   destructors run) and the promise it is suspended on is dropped, which cancels that in turn (an
//   RPC call, an `offload()` not yet started, a timer).
// Only `kj::Promise<U>` (and types derived from it, like capnp::RemotePromise) and `Co<U>` may be
// awaited; anything else is a compile error. A coroutine must not drop its own promise while it
// runs.
//
// g++ 12 destroys some temporaries written inside a co_await expression twice (a double free): a
// lambda that captures by value, and a braced aggregate (`f({a, b})`, `Spec{a, b}`). Make them
// first, as locals, then await:
//
//   auto work = context().offload([img = kj::mv(img)]() { return blur(img); });  // not inside
//   auto out = co_await kj::mv(work);
//
// tests/runtime/co_await_check.py finds both patterns in this repository's code.
//
// Why a return type of its own rather than `kj::Promise<T>` itself, as KJ 0.10 does: g++ 12
// crashes (an internal compiler error) on any coroutine whose return type holds a KJ object,
// whose destructors are noexcept(false).

#pragma once

#include <kj/async.h>
#include <kj/debug.h>

#include <coroutine>
#include <type_traits>

namespace troupe {
template <typename T>
class Co;
}  // namespace troupe

namespace troupe::detail {

class CoroutineBase {
  // What every coroutine's promise object keeps: the promise that will resume it, and the one that
  // last did (still on the stack that resumed us, so it is dropped one step later, never while it
  // runs).
 public:
  void park(kj::Promise<void> resumer) {
    retired_ = kj::mv(resumer_);
    resumer_ = kj::mv(resumer);
  }

 private:
  kj::Maybe<kj::Promise<void>> resumer_;
  kj::Maybe<kj::Promise<void>> retired_;
};

template <typename U>
class PromiseAwaiter {
  // `co_await promise`: suspends, and resumes from a continuation of the promise.
 public:
  PromiseAwaiter(CoroutineBase& co, kj::Promise<U>&& promise)
      : co_(co), promise_(kj::mv(promise)) {}

  bool await_ready() const { return false; }

  void await_suspend(std::coroutine_handle<> self) {
    auto failed = [this, self](kj::Exception&& e) {
      error_ = kj::mv(e);
      self.resume();
    };
    if constexpr (std::is_void_v<U>) {
      co_.park(promise_.then([self]() { self.resume(); }, kj::mv(failed)).eagerlyEvaluate(nullptr));
    } else {
      auto done = [this, self](U&& value) {
        value_ = kj::mv(value);
        self.resume();
      };
      co_.park(promise_.then(kj::mv(done), kj::mv(failed)).eagerlyEvaluate(nullptr));
    }
  }

  U await_resume() {
    KJ_IF_MAYBE(e, error_) {
      kj::throwFatalException(kj::mv(*e));
    }
    if constexpr (!std::is_void_v<U>) {
      KJ_IF_MAYBE(v, value_) {
        return kj::mv(*v);
      }
      KJ_UNREACHABLE;
    }
  }

 private:
  CoroutineBase& co_;
  kj::Promise<U> promise_;
  kj::Maybe<std::conditional_t<std::is_void_v<U>, bool, U>> value_;  // unused for void
  kj::Maybe<kj::Exception> error_;
};

inline kj::Exception currentException() {
  // From inside a catch block: rethrow to have KJ convert whatever it is. (Out of line from
  // unhandled_exception(): g++ 12 crashes on a lambda there.)
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([]() { throw; })) {
    return kj::mv(*e);
  }
  KJ_UNREACHABLE;
}

class FrameOwner {
  // Attached to the coroutine's promise: dropping that promise destroys the frame.
 public:
  explicit FrameOwner(std::coroutine_handle<> frame) : frame_(frame) {}
  FrameOwner(FrameOwner&& other) : frame_(other.frame_) { other.frame_ = nullptr; }
  FrameOwner(const FrameOwner&) = delete;
  ~FrameOwner() {
    if (frame_) frame_.destroy();
  }

 private:
  std::coroutine_handle<> frame_;
};

template <typename T>
class PromiseType;

template <typename T>
class PromiseTypeBase : public CoroutineBase {
 public:
  Co<T> get_return_object() {
    auto paf = kj::newPromiseAndFulfiller<T>();
    fulfiller_ = kj::mv(paf.fulfiller);
    promise_ = kj::mv(paf.promise);
    return Co<T>(
        std::coroutine_handle<PromiseType<T>>::from_promise(static_cast<PromiseType<T>&>(*this)));
  }
  std::suspend_never initial_suspend() noexcept { return {}; }
  // Stay suspended at the end: the frame belongs to the FrameOwner, which destroys it.
  std::suspend_always final_suspend() noexcept { return {}; }
  void unhandled_exception() { fulfiller_->reject(currentException()); }

  template <typename U>
  PromiseAwaiter<U> await_transform(kj::Promise<U>&& promise) {
    return PromiseAwaiter<U>(*this, kj::mv(promise));
  }
  template <typename U>
  PromiseAwaiter<U> await_transform(Co<U>&& co) {
    return PromiseAwaiter<U>(*this, kj::mv(co).promise());
  }

  kj::Promise<T> takePromise() {
    KJ_IF_MAYBE(p, promise_) {
      auto result = kj::mv(*p);
      promise_ = nullptr;
      return result;
    }
    KJ_FAIL_REQUIRE("a coroutine's promise was taken twice");
  }

 protected:
  kj::Own<kj::PromiseFulfiller<T>> fulfiller_;
  kj::Maybe<kj::Promise<T>> promise_;
};

template <typename T>
class PromiseType : public PromiseTypeBase<T> {
 public:
  void return_value(T value) { this->fulfiller_->fulfill(kj::mv(value)); }
};

template <>
class PromiseType<void> : public PromiseTypeBase<void> {
 public:
  void return_void() { this->fulfiller_->fulfill(); }
};

}  // namespace troupe::detail

namespace troupe {

template <typename T>
class [[nodiscard]] Co {
  // A running coroutine that will produce a T. Convert it to kj::Promise<T> (implicitly, or with
  // promise()) to wait for it; dropping the Co or that promise cancels it.
 public:
  using promise_type = detail::PromiseType<T>;

  Co(Co&& other) : frame_(other.frame_) { other.frame_ = nullptr; }
  Co(const Co&) = delete;
  ~Co() {
    if (frame_) frame_.destroy();
  }

  kj::Promise<T> promise() && {
    KJ_REQUIRE(frame_ != nullptr, "this coroutine was already turned into a promise");
    auto frame = frame_;
    frame_ = nullptr;
    return frame.promise().takePromise().attach(detail::FrameOwner(frame));
  }
  operator kj::Promise<T>() && { return kj::mv(*this).promise(); }

 private:
  friend class detail::PromiseTypeBase<T>;
  explicit Co(std::coroutine_handle<promise_type> frame) : frame_(frame) {}
  std::coroutine_handle<promise_type> frame_;
};

}  // namespace troupe
