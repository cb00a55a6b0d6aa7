// The libuv-in-KJ bridge: timers, pool work, cancellation, a spawned child, a signal, and an idle
// loop that does not spin.
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "troupe/loop.h"
#include "troupe/process.h"

using troupe::ChildProcess;
using troupe::EventLoop;

TEST_CASE("KJ timers run on the bridged loop", "[loop]") {
  EventLoop loop(2);
  auto start = loop.timer().now();
  loop.timer().afterDelay(20 * kj::MILLISECONDS).wait(loop.waitScope());
  REQUIRE(loop.timer().now() - start >= 20 * kj::MILLISECONDS);
}

TEST_CASE("offload runs work on the pool and returns its value", "[loop]") {
  EventLoop loop(2);
  auto mainThread = std::this_thread::get_id();
  auto result = loop.offload([mainThread]() {
                      REQUIRE(std::this_thread::get_id() != mainThread);
                      long sum = 0;
                      for (int i = 0; i < 1000000; ++i) sum += i % 7;
                      return sum;
                    })
                    .wait(loop.waitScope());
  long expected = 0;
  for (int i = 0; i < 1000000; ++i) expected += i % 7;
  REQUIRE(result == expected);

  // Many at once: all complete, void results too.
  std::atomic<int> count{0};
  auto promises = kj::heapArrayBuilder<kj::Promise<void>>(32);
  for (int i = 0; i < 32; ++i) promises.add(loop.offload([&count]() { ++count; }));
  kj::joinPromises(promises.finish()).wait(loop.waitScope());
  REQUIRE(count == 32);
}

TEST_CASE("offload propagates exceptions", "[loop]") {
  EventLoop loop(1);
  auto p = loop.offload([]() -> int { KJ_FAIL_REQUIRE("augmentation failed", 42); });
  REQUIRE_THROWS_WITH(p.wait(loop.waitScope()), Catch::Contains("augmentation failed"));
}

TEST_CASE("dropping an offload promise cancels queued work", "[loop]") {
  EventLoop loop(1);
  auto ran = std::make_shared<std::atomic<int>>(0);
  // libuv's pool is process-wide, sized by the first loop: occupy every thread, then queue work
  // behind them and drop that promise.
  int threads = atoi(getenv("UV_THREADPOOL_SIZE"));
  auto blockers = kj::heapArrayBuilder<kj::Promise<void>>(threads);
  for (int i = 0; i < threads; ++i) {
    blockers.add(
        loop.offload([]() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }));
  }
  {
    auto dropped = loop.offload([ran]() { ++*ran; });
  }
  kj::joinPromises(blockers.finish()).wait(loop.waitScope());
  loop.timer().afterDelay(50 * kj::MILLISECONDS).wait(loop.waitScope());
  REQUIRE(*ran == 0);
}

TEST_CASE("offloadInto: the job writes into its target, which outlives a dropped promise",
          "[loop]") {
  EventLoop loop(2);
  troupe::WorkGroup group;
  auto mainThread = std::this_thread::get_id();
  struct Target {
    std::vector<int> memory = std::vector<int>(1000, 0);
    std::atomic<bool>* jobRunning;
    std::atomic<int>* destroyedWhileRunning;
    std::thread::id* destroyedOn;
    ~Target() {
      if (*jobRunning) ++*destroyedWhileRunning;
      *destroyedOn = std::this_thread::get_id();
    }
  };
  std::atomic<bool> running{false};
  std::atomic<int> early{0};
  std::thread::id destroyedOn;
  auto make = [&]() { return kj::heap<Target>(Target{std::vector<int>(1000, 0), &running, &early,
                                                     &destroyedOn});
  };

  // Resolves with the target, written, and fn's result.
  auto [target, sum] = loop.offloadInto(group, make(), [](Target& t) {
                             for (size_t i = 0; i < t.memory.size(); ++i) t.memory[i] = i;
                             return 42;
                           }).wait(loop.waitScope());
  CHECK(sum == 42);
  CHECK(target->memory[999] == 999);
  target = nullptr;

  // The promise dropped while the job writes: the target waits for the job, then goes on the
  // loop thread.
  std::atomic<bool> started{false};
  {
    auto dropped = loop.offloadInto(group, make(), [&](Target& t) {
      running = true;
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (auto& m : t.memory) m = 7;
      running = false;
      return 0;
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  destroyedOn = {};
  group.whenIdle().wait(loop.waitScope());
  CHECK(early == 0);
  CHECK(destroyedOn == mainThread);
}

TEST_CASE("a spawned child's output and exit code arrive", "[loop]") {
  EventLoop loop(1);
  std::vector<std::string> lines;
  ChildProcess::Options opts;
  opts.args = {"/bin/sh", "-c", "echo hello; echo world >&2; exit 3"};
  opts.onLine = [&](kj::StringPtr line, bool err) {
    lines.push_back(std::string(err ? "E:" : "O:") + line.cStr());
  };
  ChildProcess child(loop, kj::mv(opts));
  REQUIRE(child.pid() > 0);
  auto exit = child.onExit().wait(loop.waitScope());
  REQUIRE(exit.status == 3);
  REQUIRE(exit.signal == 0);
  REQUIRE(std::find(lines.begin(), lines.end(), "O:hello") != lines.end());
  REQUIRE(std::find(lines.begin(), lines.end(), "E:world") != lines.end());
  REQUIRE(!child.running());
  REQUIRE(::kill(child.pid(), 0) != 0);  // reaped
}

TEST_CASE("a killed child reports its signal", "[loop]") {
  EventLoop loop(1);
  ChildProcess::Options opts;
  opts.args = {"/bin/sleep", "30"};
  ChildProcess child(loop, kj::mv(opts));
  child.kill(SIGTERM);
  auto exit = child.onExit().wait(loop.waitScope());
  REQUIRE(exit.signal == SIGTERM);
}

TEST_CASE("signals arrive through libuv", "[loop]") {
  EventLoop loop(1);
  int got = 0;
  auto paf = kj::newPromiseAndFulfiller<void>();
  loop.onSignal(SIGUSR2, [&](int sig) {
    got = sig;
    paf.fulfiller->fulfill();
  });
  loop.timer().afterDelay(10 * kj::MILLISECONDS).wait(loop.waitScope());
  ::kill(getpid(), SIGUSR2);
  loop.timer().timeoutAfter(2 * kj::SECONDS, kj::mv(paf.promise)).wait(loop.waitScope());
  REQUIRE(got == SIGUSR2);
}

TEST_CASE("an idle loop does not spin", "[loop]") {
  EventLoop loop(1);
  // With a signal handle registered libuv is alive with no timers: the pump must sleep on the fd.
  loop.onSignal(SIGUSR2, [](int) {});
  loop.timer().afterDelay(10 * kj::MILLISECONDS).wait(loop.waitScope());
  auto before = loop.pumpWakeups();
  clock_t cpuBefore = clock();
  loop.timer().afterDelay(300 * kj::MILLISECONDS).wait(loop.waitScope());
  REQUIRE(loop.pumpWakeups() - before <= 2);
  // Less than 50 ms of CPU over 300 ms of waiting.
  REQUIRE((clock() - cpuBefore) * 1000 / CLOCKS_PER_SEC < 50);
}

TEST_CASE("KJ timers fire while a child process runs", "[loop]") {
  EventLoop loop(1);
  ChildProcess::Options opts;
  opts.args = {"/bin/sleep", "30"};
  opts.onLine = [](kj::StringPtr, bool) {};
  ChildProcess child(loop, kj::mv(opts));
  auto start = loop.timer().now();
  loop.timer()
      .timeoutAfter(5 * kj::SECONDS, loop.timer().afterDelay(100 * kj::MILLISECONDS))
      .wait(loop.waitScope());
  REQUIRE(loop.timer().now() - start < 2 * kj::SECONDS);
  child.kill(SIGKILL);
  child.onExit().wait(loop.waitScope());
}

TEST_CASE("a KJ timer set from a child's exit fires while another child runs", "[loop]") {
  EventLoop loop(1);
  ChildProcess::Options a, b;
  a.args = {"/bin/sleep", "30"};
  a.onLine = [](kj::StringPtr, bool) {};
  b.args = {"/bin/true"};
  b.onLine = [](kj::StringPtr, bool) {};
  ChildProcess sleeper(loop, kj::mv(a));
  ChildProcess quick(loop, kj::mv(b));
  bool fired = false;
  auto p = quick.onExit().then([&](troupe::ChildExit) {
    return loop.timer().afterDelay(100 * kj::MILLISECONDS).then([&]() { fired = true; });
  });
  loop.timer().timeoutAfter(3 * kj::SECONDS, kj::mv(p)).wait(loop.waitScope());
  REQUIRE(fired);
  sleeper.kill(SIGKILL);
  sleeper.onExit().wait(loop.waitScope());
}

TEST_CASE("a child that prints and exits at once is seen to exit while another runs", "[loop]") {
  EventLoop loop(1);
  ChildProcess::Options a, b;
  a.args = {"/bin/sh", "-c", "echo sleeping; exec sleep 30"};
  a.onLine = [](kj::StringPtr, bool) {};
  b.args = {"/bin/sh", "-c", "echo bye; exit 0"};
  b.onLine = [](kj::StringPtr, bool) {};
  ChildProcess sleeper(loop, kj::mv(a));
  ChildProcess quick(loop, kj::mv(b));
  loop.onSignal(SIGTERM, [](int) {});
  auto exit = loop.timer().timeoutAfter(3 * kj::SECONDS, quick.onExit()).wait(loop.waitScope());
  REQUIRE(exit.status == 0);
  sleeper.kill(SIGKILL);
  sleeper.onExit().wait(loop.waitScope());
}
