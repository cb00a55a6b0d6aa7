// The control path (runtime/src/control): the phi-accrual detector on plain numbers, then a
// head's ControlServer and a worker's ControlClient on their own threads over loopback TCP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "control/control.h"
#include "control/detector.h"
#include "control/throttle.h"
#include "troupe/config.h"

using namespace std::chrono_literals;
using troupe::ControlClient;
using troupe::ControlServer;
using troupe::ControlSettings;
using troupe::PhiDetector;

namespace {

PhiDetector::Settings defaults() {
  ControlSettings s;  // --heartbeat-ms 500, --node-timeout-ms 3000, max 6000
  return s.detector();
}

// A silence the detector judges lost, found by stepping 10 ms at a time.
double lostAfter(const PhiDetector& d, double from) {
  for (double t = from;; t += 10) {
    if (d.lost(t)) return t - from;
  }
}

}  // namespace

TEST_CASE("detector: on a steady link a silent node is lost a little after --node-timeout-ms",
          "[control]") {
  PhiDetector d(defaults(), 0);
  double t = 0;
  for (int i = 0; i < 50; ++i) d.heartbeat(t += 500);
  CHECK_FALSE(d.lost(t + 3000));  // the node timeout itself is tolerated
  double after = lostAfter(d, t);
  CHECK(after > 3000);
  CHECK(after < 3700);
  CHECK(d.verdict(t + after).find("no heartbeat for ") == 0);
  CHECK(d.verdict(t + after).find("phi ") != std::string::npos);
}

TEST_CASE("detector: a jittery link is given the slack its history shows, up to the hard bound",
          "[control]") {
  PhiDetector steady(defaults(), 0), jittery(defaults(), 0);
  double a = 0, b = 0;
  for (int i = 0; i < 60; ++i) {
    steady.heartbeat(a += 500);
    jittery.heartbeat(b += (i % 2 == 0 ? 100 : 1300));  // a slow link: heartbeats in bursts
  }
  double steadyAfter = lostAfter(steady, a), jitteryAfter = lostAfter(jittery, b);
  INFO("steady " << steadyAfter << " ms, jittery " << jitteryAfter << " ms");
  CHECK(jitteryAfter > steadyAfter + 1000);
  // However wild the history, a node that sends nothing is lost at the hard bound.
  PhiDetector wild(defaults(), 0);
  double c = 0;
  for (int i = 0; i < 60; ++i) wild.heartbeat(c += (i % 2 == 0 ? 10 : 5000));
  CHECK(lostAfter(wild, c) == Approx(6000).margin(10));
  CHECK(wild.verdict(c + 6000).find("the hard bound") != std::string::npos);
}

TEST_CASE("detector: the judge's own stall is credited, not counted as the node's silence",
          "[control]") {
  PhiDetector d(defaults(), 0);
  double t = 0;
  for (int i = 0; i < 20; ++i) d.heartbeat(t += 500);
  d.credit(4000);  // the judge was frozen 4 s
  CHECK_FALSE(d.lost(t + 4500));
  CHECK(d.silenceMs(t + 4500) == Approx(500));
}

namespace {

ControlSettings fast(bool insecure) {
  ControlSettings s;
  s.heartbeatMs = 50;
  s.nodeTimeoutMs = 400;
  s.nodeTimeoutMaxMs = 800;
  s.headTimeoutMs = 600;
  s.secret = "a job secret of at least thirty-two characters";
  s.insecure = insecure;
  return s;
}

template <typename F>
bool within(std::chrono::milliseconds limit, F f) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

}  // namespace

TEST_CASE("control path: heartbeats flow while the caller's thread is held, and silence is judged",
          "[control]") {
  for (bool insecure : {true, false}) {
    INFO((insecure ? "--insecure" : "TLS"));
    ControlServer server(fast(insecure), "127.0.0.1", 0);
    REQUIRE(server.port() != 0);
    server.admit(2, "algo-2");
    auto client = std::make_unique<ControlClient>(
        fast(insecure), troupe::controlAddress("127.0.0.1:1", server.port()), 2);
    CHECK(within(3s, [&] { return server.silenceMs(2).value_or(1 << 30) < 100; }));
    // This thread (a node's main loop, say) is held for three node timeouts: the control
    // threads go on, nobody is lost.
    std::this_thread::sleep_for(1200ms);
    CHECK(server.takeLost().empty());
    CHECK(client->sinceHeardMs() < 300);
    CHECK_FALSE(client->fenced().has_value());
    CHECK(client->frozenMs() == 0);
    // The worker's process goes away: its silence is judged within the hard bound.
    client.reset();
    std::vector<ControlServer::Lost> lost;
    CHECK(within(2s, [&] { return !(lost = server.takeLost()).empty(); }));
    REQUIRE(lost.size() == 1);
    CHECK(lost[0].nodeId == 2);
    CHECK(lost[0].why.find("no heartbeat for ") == 0);
    CHECK(server.takeLost().empty());  // each loss is reported once
  }
}

TEST_CASE("control path: a fenced node hears it on its next heartbeat", "[control]") {
  ControlServer server(fast(true), "127.0.0.1", 0);
  server.admit(3, "algo-3");
  ControlClient client(fast(true), troupe::controlAddress("127.0.0.1:1", server.port()), 3);
  CHECK(within(3s, [&] { return server.silenceMs(3).value_or(1 << 30) < 100; }));
  server.fence(3, "its connection closed");
  CHECK(within(2s, [&] { return client.fenced().has_value(); }));
  CHECK(client.fenced().value_or("") == "its connection closed");
  CHECK_FALSE(server.silenceMs(3).has_value());
}

TEST_CASE("control path: a wrong token or an unknown node id is never counted alive",
          "[control]") {
  ControlServer server(fast(true), "127.0.0.1", 0);
  server.admit(4, "algo-4");
  auto wrong = fast(true);
  wrong.secret = "another secret, also of thirty-two characters";
  ControlClient stranger(wrong, troupe::controlAddress("127.0.0.1:1", server.port()), 4);
  ControlClient unknown(fast(true), troupe::controlAddress("127.0.0.1:1", server.port()), 9);
  CHECK(within(3s, [&] { return unknown.fenced().has_value(); }));
  CHECK(unknown.fenced()->find("node id 9 is unknown") != std::string::npos);
  std::vector<ControlServer::Lost> lost;
  CHECK(within(3s, [&] { return !(lost = server.takeLost()).empty(); }));
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].nodeId == 4);  // the stranger's heartbeats did not keep it alive
  CHECK(stranger.sinceHeardMs() > 500);
}

TEST_CASE("control path: a port in use is refused naming it and --control-port", "[control]") {
  ControlServer first(fast(true), "127.0.0.1", 0);
  try {
    ControlServer second(fast(true), "127.0.0.1", first.port());
    FAIL("the second server bound a port in use");
  } catch (const troupe::ConfigError& e) {
    std::string what = e.what();
    CHECK(what.find("127.0.0.1:" + std::to_string(first.port())) != std::string::npos);
    CHECK(what.find("--control-port") != std::string::npos);
  }
}

namespace {

// A TCP connection to 127.0.0.1:port that sends nothing, or -1.
// A connection to the control port that says nothing, from 127.0.0.`from` (loopback has them all).
int silentConnection(uint16_t port, int from = 1) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + from);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closed `fd` within `ms` (recv() returns 0 or an error).
bool closedWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

}  // namespace

TEST_CASE("control path: connections past --max-unauthenticated that have not said hello are closed at once",
          "[control]") {
  auto settings = fast(false);
  settings.maxUnauthenticated = 2;
  ControlServer server(settings, "127.0.0.1", 0);
  int a = silentConnection(server.port()), b = silentConnection(server.port());
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  std::this_thread::sleep_for(200ms);  // both accepted: the cap is full
  int c = silentConnection(server.port());
  REQUIRE(c >= 0);
  CHECK(closedWithin(c, 2000));
  CHECK_FALSE(closedWithin(a, 300));  // the first two wait for their handshake (5 s)
  CHECK_FALSE(closedWithin(b, 300));
  close(a);
  close(b);
  close(c);
  // Their places are free again: a node gets in.
  std::this_thread::sleep_for(200ms);
  server.admit(5, "algo-5");
  ControlClient client(settings, troupe::controlAddress("127.0.0.1:1", server.port()), 5);
  CHECK(within(3s, [&] { return server.silenceMs(5).value_or(1 << 30) < 100; }));
}

TEST_CASE("control path: one address holds at most three quarters of the places before hello",
          "[control]") {
  auto settings = fast(false);
  settings.maxUnauthenticated = 4;  // 3 for one address
  ControlServer server(settings, "127.0.0.1", 0);
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(silentConnection(server.port()));
    REQUIRE(fds.back() >= 0);
    std::this_thread::sleep_for(50ms);  // accepted in order
  }
  CHECK(closedWithin(fds[3], 2000));  // the fourth from 127.0.0.1
  CHECK_FALSE(closedWithin(fds[0], 300));
  // The place kept for another address: a node connecting from its own gets it.
  int other = silentConnection(server.port(), 2);
  REQUIRE(other >= 0);
  CHECK_FALSE(closedWithin(other, 500));
  // Now every place is taken, for any address.
  int third = silentConnection(server.port(), 3);
  REQUIRE(third >= 0);
  CHECK(closedWithin(third, 2000));
  for (int fd : fds) close(fd);
  close(other);
  close(third);
}

TEST_CASE("a stall is said to be the CPUs' when the thread waited for one most of it, else a "
          "stop or the kernel's",
          "[control][throttle]") {
  troupe::ThrottleWatch::Held held;
  held.runQueueMs = 1795;
  auto busy = troupe::throttleNote(held, 1295);
  CHECK(busy == "; meanwhile it was runnable but not running for 1795 ms (schedstat run_delay)");
  held.runQueueMs = 4;
  auto stopped = troupe::throttleNote(held, 3585);
  CHECK(stopped.find("; it waited for a CPU 4 ms of it (schedstat run_delay): the rest of the time "
                     "the process was stopped") == 0);
  held.stateNow = 'R';  // read from another thread while the stall goes on: its wait not counted
  CHECK(troupe::throttleNote(held, 3585) ==
        "; it is runnable and has not run since: waiting for a CPU");
  held.stateNow = 0;
  held.runQueueMs = -1;  // not known (no schedstat): nothing said of it
  CHECK(troupe::throttleNote(held, 3585).empty());
  held.stealMs = 20;
  held.ms = 3029;
  held.file = "/sys/fs/cgroup/x/cpu.stat";
  auto quota = troupe::throttleNote(held, 3585);
  CHECK(quota.find("; the hypervisor took 20 ms of its CPUs (steal, /proc/stat)") == 0);
  CHECK(quota.find("; its cgroup's CPU quota throttled it 3029 ms (/sys/fs/cgroup/x/cpu.stat)") !=
        std::string::npos);
}
