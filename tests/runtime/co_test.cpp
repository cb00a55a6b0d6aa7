// The coroutine adapter (troupe/co.h): values, exceptions, eager start, RPC calls awaited and
// served as coroutines, and cancellation when the coroutine's promise is dropped.
#include "troupe/co.h"

#include <capnp/capability.h>

#include <catch2/catch.hpp>
#include <memory>

#include "troupe.capnp.h"
#include "troupe/loop.h"

using troupe::EventLoop;

namespace {

struct Flag {
  // Sets *flag when destroyed: shows that a frame's locals, or an attachment, were dropped.
  explicit Flag(bool* flag) : flag_(flag) {}
  Flag(Flag&& other) : flag_(other.flag_) { other.flag_ = nullptr; }
  ~Flag() {
    if (flag_) *flag_ = true;
  }
  bool* flag_;
};

troupe::Co<int> addLater(EventLoop& loop, int a, int b) {
  co_await loop.timer().afterDelay(1 * kj::MILLISECONDS);
  auto add = loop.offload([a, b]() { return a + b; });  // not inside co_await: see co.h
  co_return co_await kj::mv(add);
}

troupe::Co<int> sumOf(EventLoop& loop, int n) {
  int total = 0;
  for (int i = 0; i < n; ++i) total += co_await addLater(loop, i, 1);
  co_return total;
}

troupe::Co<void> failing(EventLoop& loop) {
  co_await loop.timer().afterDelay(1 * kj::MILLISECONDS);
  KJ_FAIL_REQUIRE("augmenter lost", 7);
}

troupe::Co<kj::String> recovering(EventLoop& loop) {
  try {
    co_await failing(loop);
  } catch (const kj::Exception& e) {
    co_return kj::str("caught: ", e.getDescription());
  }
  co_return kj::str("not reached");
}

class CountingWatcher final : public troupe::proto::Watcher::Server {
  // A server method written as a coroutine.
 public:
  CountingWatcher(EventLoop& loop, int& downs) : loop_(loop), downs_(downs) {}
  kj::Promise<void> down(DownContext call) override { return downCo(call); }

 private:
  troupe::Co<void> downCo(DownContext call) {
    auto kind = call.getParams().getReason().getKind();
    auto id = call.getParams().getId();
    co_await loop_.timer().afterDelay(1 * kj::MILLISECONDS);
    KJ_REQUIRE(kind != troupe::proto::ExitReason::Kind::FAILED, "refusing a failed exit", id);
    ++downs_;
  }

  EventLoop& loop_;
  int& downs_;
};

troupe::Co<int> callTwice(troupe::proto::Watcher::Client watcher) {
  auto req = watcher.downRequest();
  req.setId(1);
  req.initReason().setKind(troupe::proto::ExitReason::Kind::NORMAL);
  co_await req.send();  // a capnp::RemotePromise
  auto bad = watcher.downRequest();
  bad.setId(2);
  bad.initReason().setKind(troupe::proto::ExitReason::Kind::FAILED);
  try {
    co_await bad.send();
  } catch (const kj::Exception& e) {
    co_return 1;
  }
  co_return 0;
}

}  // namespace

TEST_CASE("a coroutine returns its value through kj::Promise", "[co]") {
  EventLoop loop(2);
  REQUIRE(addLater(loop, 2, 3).promise().wait(loop.waitScope()) == 5);
  REQUIRE(sumOf(loop, 20).promise().wait(loop.waitScope()) == 20 * 19 / 2 + 20);
}

TEST_CASE("a coroutine starts at once and runs to its first co_await", "[co]") {
  EventLoop loop(1);
  int steps = 0;
  auto body = [&]() -> troupe::Co<void> {
    ++steps;
    co_await kj::evalLater([]() {});
    ++steps;
  };
  kj::Promise<void> p = body();
  REQUIRE(steps == 1);
  p.wait(loop.waitScope());
  REQUIRE(steps == 2);
}

TEST_CASE("exceptions: a rejected co_await throws, an escaping exception rejects", "[co]") {
  EventLoop loop(1);
  REQUIRE_THROWS_WITH(failing(loop).promise().wait(loop.waitScope()),
                      Catch::Contains("augmenter lost"));
  auto text = recovering(loop).promise().wait(loop.waitScope());
  REQUIRE(std::string(text.cStr()).find("caught: ") == 0);
  REQUIRE(std::string(text.cStr()).find("augmenter lost") != std::string::npos);
}

TEST_CASE("many co_awaits in a loop resume from the event loop, not a growing stack", "[co]") {
  EventLoop loop(1);
  auto count = [](int n) -> troupe::Co<int> {
    int i = 0;
    while (i < n) {
      co_await kj::evalLater([]() {});
      ++i;
    }
    co_return i;
  };
  REQUIRE(count(100000).promise().wait(loop.waitScope()) == 100000);
}

TEST_CASE("dropping a coroutine's promise destroys its frame and cancels what it awaits", "[co]") {
  EventLoop loop(1);
  bool localDropped = false, awaitedDropped = false, resumed = false;
  auto paf = kj::newPromiseAndFulfiller<int>();
  auto body = [&](kj::Promise<int> awaited) -> troupe::Co<void> {
    Flag local(&localDropped);
    co_await awaited.attach(Flag(&awaitedDropped));
    resumed = true;
  };
  {
    kj::Promise<void> p = body(kj::mv(paf.promise));
    loop.timer().afterDelay(1 * kj::MILLISECONDS).wait(loop.waitScope());
    REQUIRE(paf.fulfiller->isWaiting());
    REQUIRE_FALSE(localDropped);
    REQUIRE_FALSE(awaitedDropped);
  }
  REQUIRE(localDropped);
  REQUIRE(awaitedDropped);
  REQUIRE_FALSE(paf.fulfiller->isWaiting());
  paf.fulfiller->fulfill(1);  // too late: nobody is resumed
  loop.timer().afterDelay(1 * kj::MILLISECONDS).wait(loop.waitScope());
  REQUIRE_FALSE(resumed);
}

TEST_CASE("dropping a finished coroutine's promise is harmless", "[co]") {
  EventLoop loop(1);
  bool localDropped = false;
  auto body = [&]() -> troupe::Co<int> {
    Flag local(&localDropped);
    co_await kj::evalLater([]() {});
    co_return 3;
  };
  {
    kj::Promise<int> p = body();
    loop.timer().afterDelay(1 * kj::MILLISECONDS).wait(loop.waitScope());
    REQUIRE(localDropped);  // the body ran to its end; the frame waits for its owner
  }
}

TEST_CASE("RPC: a call is awaited, and a server method is a coroutine", "[co]") {
  EventLoop loop(1);
  int downs = 0;
  troupe::proto::Watcher::Client watcher = kj::heap<CountingWatcher>(loop, downs);
  REQUIRE(callTwice(watcher).promise().wait(loop.waitScope()) == 1);
  REQUIRE(downs == 1);
}

TEST_CASE("dropping a Co that was never turned into a promise cancels it too", "[co]") {
  EventLoop loop(1);
  bool localDropped = false, resumed = false;
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto body = [&](kj::Promise<void> awaited) -> troupe::Co<void> {
    Flag local(&localDropped);
    co_await kj::mv(awaited);
    resumed = true;
  };
  { auto co = body(kj::mv(paf.promise)); }
  REQUIRE(localDropped);
  REQUIRE_FALSE(paf.fulfiller->isWaiting());
  REQUIRE_FALSE(resumed);
}

namespace {

class Job {
  // A member coroutine whose awaited pool work fails, owned by the promise it returns.
 public:
  explicit Job(EventLoop& loop) : loop_(loop) {}
  troupe::Co<void> run() {
    size_t n = co_await loop_.offload([]() -> size_t { KJ_FAIL_REQUIRE("no dataset here"); });
    KJ_REQUIRE(n > 0);
    co_await kj::evalLater([]() {});
  }

 private:
  EventLoop& loop_;
};

}  // namespace

TEST_CASE("a member coroutine whose pool work fails rejects, and its owner is freed", "[co]") {
  EventLoop loop(2);
  for (int i = 0; i < 50; ++i) {
    auto job = kj::heap<Job>(loop);
    auto& ref = *job;
    auto p = ref.run().promise().attach(kj::mv(job));
    REQUIRE_THROWS_WITH(p.wait(loop.waitScope()), Catch::Contains("no dataset here"));
  }
}
