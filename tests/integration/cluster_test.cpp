// Multi-process clusters on loopback: how jobs end, on every path, and that nothing is left.
// The actor runtime under the same clusters (mailboxes, deadlines, capacity): cluster_runtime_test.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "cluster_test.h"
#include "harness.h"

using namespace std::chrono_literals;
using harness::count;
using harness::instanceIn;
using harness::probe;
using harness::Run;
using cluster_test::kThree;
using cluster_test::with;

namespace {

// Every instance but the head exited HEAD_LOST.
void checkWorkersLostHead(const Run& run, const std::string& headHost) {
  for (auto& [host, i] : run.instances()) {
    if (host == headHost) continue;
    CHECK(run.exitLine(host).find("exited with 3 (HEAD_LOST)") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a job that ends normally: every process exits 0", "[cluster]") {
  Run run(harness::sim(kThree, probe("normal")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(count(out, "PING ") == 3);
  CHECK(out.find("all 3 instances exited 0") != std::string::npos);
  // The cascade stopped every actor before the nodes exited.
  CHECK(count(out, "STOPPED p") == 3);
  CHECK(run.leftovers().empty());
}

TEST_CASE("an app's printf lines keep their order among the log lines under troupe sim",
          "[cluster]") {
  // stdout is a pipe under the sim: without line buffering both PRINTED lines came at exit, after
  // LOGGED (issue 24).
  Run run(harness::sim(kThree, probe("printing")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(harness::outOfOrder(out, {"PRINTED one", "LOGGED two", "PRINTED three"}) == "");
}

namespace {
// The rest of the first line of `out` that starts with `prefix` (after "[algo-N] ").
std::string lineAfter(const std::string& out, const std::string& prefix) {
  auto at = out.find(prefix);
  if (at == std::string::npos) return "";
  at += prefix.size();
  return out.substr(at, out.find('\n', at) - at);
}
}  // namespace

TEST_CASE("a call through the wrong interface names the actor, one to a lost node names the node",
          "[cluster][bad-input]") {
  // Both were Cap'n Proto's own text: "Requested interface not implemented ... requestedTypeId =
  // ..." and "Peer disconnected." (issue 24).
  Run run(harness::sim(kThree, probe("errors")));
  REQUIRE_OUTPUT(run, "ERRORS-READY ", 30s);
  auto host = lineAfter(run.output(), "ERRORS-READY ");
  auto instances = run.instances();
  REQUIRE(instances.count(host) == 1);
  REQUIRE(kill(instances[host].pid, SIGKILL) == 0);
  REQUIRE_OUTPUT(run, "LOST-CALL: ", 20s);
  run.wait(30s);
  auto out = run.output();
  INFO(out);
  auto wrong = lineAfter(out, "WRONG-INTERFACE: ");
  CHECK(wrong.find("(probe.Probe #") != std::string::npos);
  CHECK(wrong.find(" on algo-") != std::string::npos);
  CHECK(wrong.find("was called through another interface") != std::string::npos);
  CHECK(wrong.find("spawn and call it as probe.Probe") != std::string::npos);
  auto lost = lineAfter(out, "LOST-CALL: ");
  CHECK(lost.find("the connection to node " + host + " (data_group) at " +
                  instances[host].address) != std::string::npos);
  CHECK(out.find("Requested interface not implemented") == std::string::npos);
  CHECK(out.find("Peer disconnected") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("an actor type registered twice is a configuration error on every node, not an abort",
          "[cluster][bad-input]") {
  // It was a KJ_REQUIRE in main(), before run(): an uncaught exception, exit 134 (issue 24).
  Run run(harness::sim(kThree, probe("normal")), {"PROBE_REGISTER_TWICE=1"});
  int code = run.wait(30s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 2);  // CONFIG_ERROR
  CHECK(count(out, "configuration error: actor type 'probe.Probe' is registered twice in this "
                   "program (troupe::Registry::add)") == 3);
  CHECK(count(out, "exited with 2 (CONFIG_ERROR)") == 3);
  CHECK(run.leftovers().empty());
}

TEST_CASE("kill -9 of a worker mid-job: every other process exits non-zero, naming the host",
          "[cluster][fault]") {
  Run run(harness::sim(kThree, probe("hold")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  auto victim = instanceIn(run, "data_group");
  auto killedAt = std::chrono::steady_clock::now();
  REQUIRE(kill(victim.pid, SIGKILL) == 0);
  int code = run.wait(20s);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - killedAt);
  auto out = run.output();
  INFO(out);
  WARN("the job ended " << took.count() << " ms after kill -9 of " << victim.host);
  REQUIRE(code != 0);
  CHECK(took < 5000ms);
  // The one failure line names the lost host: the head's verdict, or, where the driver's call on
  // it failed first (seen under ASan at -O0), that call's broken connection.
  bool lost = out.find("node " + victim.host + " (data_group) was lost") != std::string::npos;
  bool broke = out.find("the connection to node " + victim.host + " (data_group) at ") !=
               std::string::npos;
  CHECK((lost || broke));
  CHECK(out.find("job failed") != std::string::npos);
  for (auto& [host, i] : run.instances()) {
    CHECK(run.exitLine(host).find("exited with") != std::string::npos);
  }
  CHECK(run.leftovers().empty());
}

TEST_CASE("kill -9 of the head: workers exit non-zero with HEAD_LOST", "[cluster][fault]") {
  Run run(harness::sim(with(kThree, {"--env", "data_group:TROUPE_HEAD_TIMEOUT_MS=2000"}),
                       probe("hold")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  auto head = instanceIn(run, "dnn_group");
  REQUIRE(kill(head.pid, SIGKILL) == 0);
  REQUIRE(run.wait(20s) != 0);
  auto out = run.output();
  INFO(out);
  checkWorkersLostHead(run, head.host);
  CHECK(out.find("lost the head " + head.host) != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("SIGTERM to troupe sim: a graceful cascade, every process exits", "[cluster][fault]") {
  Run run(harness::sim(kThree, probe("hold")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  REQUIRE(kill(run.pid(), SIGTERM) == 0);
  REQUIRE(run.wait(20s) == 6);  // INTERRUPTED
  auto out = run.output();
  INFO(out);
  CHECK(count(out, "STOPPED p") == 3);  // actors were stopped, not just killed
  for (auto& [host, i] : run.instances()) {
    CHECK(run.exitLine(host).find("exited with 6 (INTERRUPTED)") != std::string::npos);
  }
  CHECK(run.leftovers().empty());
}

TEST_CASE("links: an abnormal exit propagates with its reason, a normal one does not",
          "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("links")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("B DOWN failed: actor 'a'") != std::string::npos);
  CHECK(out.find("failed: boom") != std::string::npos);
  CHECK(out.find("D ALIVE") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("fail() from any point of a method fails that call with the reason, never the node",
          "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("fail-anywhere")));
  int code = run.wait(60s);
  auto out = run.output();
  INFO(out);
  // docs/lifecycle.md: fail() ends the actor and fails the call in flight with the reason.
  for (auto name : {"f0", "f1", "f2", "f3"}) {
    INFO("fail point " << name);
    CHECK(out.find(std::string("FAIL ") + name + " DISCONNECTED") != std::string::npos);
    CHECK(out.find(std::string("fault ") + name) != std::string::npos);
    CHECK(out.find(std::string("FAIL ") + name + " RETURNED") == std::string::npos);
    CHECK(out.find(std::string("FAIL ") + name + " EXIT failed: ") != std::string::npos);
    // ... and never the node: the actor beside it still answers.
    CHECK(out.find(std::string("FAIL ") + name + " NODE ALIVE") != std::string::npos);
  }
  // docs/exit-codes.md: the unlinked failures do not fail the job; no process crashed.
  CHECK(code == 0);
  CHECK(out.find("exited with") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("monitors: one down with the reason, also after the death", "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("monitors")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("EARLY failed: actor 'a'") != std::string::npos);
  CHECK(out.find("LATE failed: actor 'a'") != std::string::npos);
  CHECK(out.find("on purpose") != std::string::npos);
  CHECK(out.find("NOBODY no actor") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("restarts: new incarnations, then escalation to the driver past the limit",
          "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("restarts")));
  REQUIRE(run.wait(30s) == 1);  // JOB_FAILED once the limit is passed
  auto out = run.output();
  INFO(out);
  CHECK(out.find("INCARNATION 1 on") != std::string::npos);
  CHECK(out.find("INCARNATION 2 on") != std::string::npos);
  CHECK(out.find("INCARNATION 3 on") != std::string::npos);
  CHECK(out.find("INCARNATION 4") == std::string::npos);
  CHECK(out.find("restart limit reached: 2") != std::string::npos);
  CHECK(out.find("crash 3") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a reference kept across restarts reaches each new incarnation, then says why it is gone",
          "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("follow")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("FOLLOWED incarnation 1 on") != std::string::npos);
  CHECK(out.find("FOLLOWED incarnation 2 on") != std::string::npos);
  CHECK(out.find("FOLLOWED incarnation 3 on") != std::string::npos);
  CHECK(out.find("now go to incarnation 2") != std::string::npos);
  CHECK(out.find("now go to incarnation 3") != std::string::npos);
  CHECK(out.find("CALL FAILED other") == std::string::npos);
  // The head's answer, with the reason the actor was not restarted again.
  CHECK(out.find("GONE: actor #1 has exited: failed: ") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("after a restart notice the next call through a kept reference reaches the new incarnation",
          "[cluster][lifecycle]") {
  // For each way an incarnation ends: context().fail() called through another reference (only the
  // head can tell this one), a method that threw, its node lost.
  Run run(harness::sim(kThree, probe("follow-notice")));
  int code = run.wait(60s);
  auto out = run.output();
  INFO(out);
  CHECK(harness::headDoneHostKilled(code, out));  // its probe kills a worker for good
  CHECK(out.find("NEXT CALL after fail reached incarnation 2") != std::string::npos);
  CHECK(out.find("NEXT CALL after throw reached incarnation 3") != std::string::npos);
  CHECK(out.find("NEXT CALL after node-lost reached incarnation 4") != std::string::npos);
  CHECK(out.find("FAILED") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a reference follows its actor to another node when the first one is lost",
          "[cluster][lifecycle][fault]") {
  Run run(harness::sim(kThree, probe("follow-node")));
  REQUIRE_OUTPUT(run, "HOSTED on ", 30s);
  auto out = run.output();
  auto at = out.find("HOSTED on ") + strlen("HOSTED on ");
  auto victim = out.substr(at, out.find('\n', at) - at);
  auto instances = run.instances();
  REQUIRE(instances.count(victim) == 1);
  REQUIRE(kill(instances[victim].pid, SIGKILL) == 0);
  int code = run.wait(30s);
  out = run.output();
  INFO(out);
  // docs/exit-codes.md: the head's job finished; the killed instance is reported on its own line
  // and makes the sim's status, judged as SageMaker judges a job, 137.
  CHECK(harness::headDoneHostKilled(code, out));
  CHECK(run.exitLine(victim).find("exited with 137") != std::string::npos);
  CHECK(out.find("FOLLOWED to incarnation 2 on ") != std::string::npos);
  CHECK(out.find("FOLLOWED to incarnation 2 on " + victim) == std::string::npos);
  for (auto& [host, i] : instances) {
    if (host != victim) CHECK(run.exitLine(host).empty());
  }
  CHECK(run.leftovers().empty());
}

TEST_CASE("the cascade stops children before parents and kills a stubborn actor",
          "[cluster][lifecycle]") {
  Run run(harness::sim(kThree, probe("cascade")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(harness::outOfOrder(out, {"STOPPED parent.2", "STOPPED parent.1", "STOPPED parent\n"}) ==
        "");
  CHECK(out.find("STOPPED stubborn") != std::string::npos);
  CHECK(out.find("did not stop cleanly within 300 ms") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a wrong token is refused: that node exits AUTH_FAILED, the head reports it missing",
          "[cluster][bad-input]") {
  // The data instance's own secret (TROUPE_TOKEN replaces sim's TROUPE_TOKEN_FILE for it).
  Run run(harness::sim({"--group", "data_group=1", "--group", "dnn_group=1:ml.p3.2xlarge", "--env",
                        "data_group:TROUPE_TOKEN=not-the-job-secret-0123456789abcdef", "--env",
                        "dnn_group:TROUPE_JOIN_TIMEOUT_MS=3000"},
                       probe("normal")));
  REQUIRE(run.wait(30s) != 0);
  auto out = run.output();
  INFO(out);
  auto data = instanceIn(run, "data_group");
  auto head = instanceIn(run, "dnn_group");
  CHECK(run.exitLine(data.host).find("exited with 4 (AUTH_FAILED)") != std::string::npos);
  CHECK(run.exitLine(head.host).find("exited with 5 (JOIN_FAILED)") != std::string::npos);
  CHECK(out.find("authentication failed") != std::string::npos);
  CHECK(out.find("refused a connection from") != std::string::npos);  // the head: no TLS handshake
  CHECK(out.find("still missing " + data.host) != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("stray connections, garbage and oversized messages do not disturb the job",
          "[cluster][bad-input]") {
  Run run(harness::sim(kThree, probe("linger")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  std::vector<int> fds;
  for (auto& [host, i] : run.instances()) {
    int idle = harness::connectTo(i.address);  // connects and says nothing
    int garbage = harness::connectTo(i.address);
    int huge = harness::connectTo(i.address);
    REQUIRE((idle >= 0 && garbage >= 0 && huge >= 0));
    fds.push_back(idle);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xfe\xfd";
    CHECK(write(garbage, junk, sizeof(junk)) == sizeof(junk));
    fds.push_back(garbage);
    uint32_t frame[2] = {0, 0x10000000};  // one segment of 2 GiB: over the message limit
    CHECK(write(huge, frame, sizeof(frame)) == sizeof(frame));
    fds.push_back(huge);
  }
  REQUIRE(run.wait(30s) == 0);
  for (int fd : fds) close(fd);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("LINGERED") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("spawning an unregistered type fails the job with a clear error",
          "[cluster][bad-input]") {
  Run run(harness::sim(kThree, probe("unregistered")));
  REQUIRE(run.wait(30s) == 1);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("cannot spawn 'no.SuchType': no actor type of that name is registered; "
                 "registered types: probe.Probe") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a preference for a group the cluster lacks is placed anyway, with a warning",
          "[cluster][bad-input]") {
  Run run(harness::sim(kThree, probe("prefer-unknown")));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("preferred group 'data_grup' is not in this cluster (groups: data_group, "
                 "dnn_group)") != std::string::npos);
  CHECK(out.find("PLACED on ") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("an impossible placement fails at once with the reason", "[cluster][bad-input]") {
  Run run(harness::sim(kThree, probe("unplaceable")));
  REQUIRE(run.wait(30s) == 1);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("cannot place 'probe.Probe': no node in group 'dnn_group' has 64 free gpu") !=
        std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a malformed cluster file: exit 2 naming the file and the key", "[bad-input]") {
  char path[] = "/tmp/troupe-cluster-XXXXXX";
  int fd = mkstemp(path);
  const char text[] = R"({"hosts": ["algo-1"], "current_group_name": "g"})";
  REQUIRE(write(fd, text, sizeof(text) - 1) == sizeof(text) - 1);
  close(fd);
  Run run({harness::probeApp()}, {std::string("TROUPE_CLUSTER_FILE=") + path});
  REQUIRE(run.wait(10s) == 2);
  auto out = run.output();
  INFO(out);
  CHECK(out.find(std::string("cluster file ") + path + ": key 'current_host' is missing") !=
        std::string::npos);
  unlink(path);
}

TEST_CASE("a silent worker (SIGSTOP) is declared lost by missed heartbeats", "[cluster][fault]") {
  Run run(harness::sim(with(kThree, {"--linger-ms", "1000", "--grace-ms", "1000", "--env",
                                     "dnn_group:TROUPE_NODE_TIMEOUT_MS=1500"}),
                       probe("hold")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  // The worker joined before READY. A worker the head has not heard on the control path is
  // declared lost the first-contact bound (6000 ms: twice the detector's 3000 ms hard bound)
  // after joining; past it with nobody lost, the head has heard the worker's heartbeats (the
  // first is sent at once), so the stop below lands on a node heard, which only the detector may
  // judge. (A stop before the first heartbeat, seen once with the CPUs oversubscribed, was judged
  // by the first-contact bound instead: a verdict that would pass a head that heard no heartbeat.)
  std::this_thread::sleep_for(6500ms);
  if (run.output().find("was lost") != std::string::npos) {
    FAIL("a node was lost before the stop, its heartbeats not heard:\n" << run.output());
  }
  auto victim = instanceIn(run, "data_group");
  auto stoppedAt = std::chrono::steady_clock::now();
  REQUIRE(kill(victim.pid, SIGSTOP) == 0);
  REQUIRE_OUTPUT(run, "job failed", 10s);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - stoppedAt);
  WARN("the head declared " << victim.host << " lost " << took.count() << " ms after SIGSTOP");
  REQUIRE(run.wait(20s) != 0);
  auto out = run.output();
  INFO(out);
  // Judged by the phi-accrual detector: past the node timeout, within its hard bound (twice it).
  auto lost = "node " + victim.host + " (data_group) was lost: ";
  auto at = out.find(lost + "no heartbeat for ");
  CHECK(out.find(lost + "no heartbeat on the control path within") == std::string::npos);
  REQUIRE(at != std::string::npos);
  int silence = std::stoi(out.substr(out.find("for ", at) + 4));
  CHECK(silence > 1500);
  CHECK(silence <= 3000 + 200);
  for (auto& [host, i] : run.instances()) {
    if (host == victim.host) {
      CHECK(run.exitLine(host).find("exited with 137") != std::string::npos);  // SIGKILLed
    } else {
      CHECK(run.exitLine(host).find("exited with 1 (JOB_FAILED)") != std::string::npos);
    }
  }
  CHECK(run.leftovers().empty());
}

// The control path (docs/lifecycle.md, "The control path"): liveness that no actor method can
// starve.

TEST_CASE(
    "an actor method holding the head's and a worker's event loop for 8 s (past the node and head "
    "timeouts) loses no node, and each node names the actor, its type and the method",
    "[cluster][control][whole-machine]") {
  Run run(harness::sim(kThree, with(probe("stall"), {"--hold-ms", "8000"})));
  REQUIRE_OUTPUT(run, "READY", 30s);
  REQUIRE_OUTPUT(run, "HELD", 30s);
  CHECK(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("troupe sim: all 3 instances exited 0") != std::string::npos);
  CHECK(out.find("was lost") == std::string::npos);
  CHECK(out.find("HEAD_LOST") == std::string::npos);
  const std::string held = " in Probe.work held the event loop for ";
  for (const std::string holder : {"'holder-head' (probe.Probe #", "'holder-data' (probe.Probe #"}) {
    INFO(holder);
    std::string warning;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.find(holder) != std::string::npos && line.find(held) != std::string::npos) {
        warning = line;
      }
    }
    REQUIRE_FALSE(warning.empty());
    CHECK(std::stol(warning.substr(warning.find(held) + held.size())) >= 7900);
  }
  CHECK(run.leftovers().empty());
}

namespace {

// Busy loops, `perCpu` on every CPU, for as long as it lives; killed and reaped after.
class Oversubscribe {
 public:
  explicit Oversubscribe(int perCpu) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < cpus * perCpu; ++i) {
      troupe::subprocess::Spec spec;
      spec.argv = {"sh", "-c", "while :; do :; done"};
      spec.ownProcessGroup = true;
      spec.parentDeathSignal = SIGKILL;
      loops_.push_back(std::make_unique<troupe::subprocess::Child>(spec));
    }
  }
  size_t size() const { return loops_.size(); }

 private:
  std::vector<std::unique_ptr<troupe::subprocess::Child>> loops_;
};

}  // namespace

TEST_CASE(
    "a consumer on the head works inline while 8 streams feed it and every CPU is oversubscribed "
    "4x by busy loops, and every instance exits 0 with every message counted, 3 of 3 runs",
    "[cluster][control][whole-machine]") {
  for (int round = 1; round <= 3; ++round) {
    INFO("run " << round << " of 3");
    Oversubscribe busy(4);
    WARN("run " << round << ": " << busy.size() << " busy loops");
    // 8 producers x 600 messages of 64 KiB; the consumer spins 300 us inline on each.
    Run run(harness::sim(kThree, with(probe("busy-head"), {"--messages", "600"})));
    REQUIRE_OUTPUT(run, "FEEDING 4800 messages", 60s);
    CHECK(run.wait(180s) == 0);
    auto out = run.output();
    INFO(out);
    CHECK(out.find("FED 4800 messages, " + std::to_string(4800ull * 65536) + " bytes") !=
          std::string::npos);
    CHECK(out.find("troupe sim: all 3 instances exited 0") != std::string::npos);
    CHECK(out.find("was lost") == std::string::npos);
    CHECK(run.leftovers().empty());
  }
}

TEST_CASE(
    "512 instances in 8 groups form on loopback: 512 distinct ports, every node counted alive, "
    "every process exits 0",
    "[cluster][control][whole-machine]") {
  // 512 processes on 2 cores: the head takes about 500 joins at once, its loop never running dry
  // for seconds. Seen before the coalescing stream's flush deadline: every join reply held until
  // the last node had joined (13 s), and the first nodes to join fenced for no heartbeat within
  // 12 s of joining (2 runs of 5).
  int groups = 8, perGroup = 64;
#if defined(__SANITIZE_ADDRESS__)
  // 256 instrumented processes hold about 13 GB of shadow memory and quarantine on a 24 GiB VM.
  groups = 4;
  perGroup = 16;
  WARN("under ASan: 4 groups of 16 instances, not 8 of 64 (memory); the plain build runs 512");
#endif
  // What is tested is that 512 form, not how fast (bench_cluster measures formation): on 2 cores
  // with a compilation beside the suite, 24 of 512 had not joined after the default 60 s (CI's
  // .ci/run builds the image there), so every instance is given 180 s, within the 240 s wait.
  std::vector<std::string> args;
  for (int g = 1; g <= groups; ++g) {
    auto group = g == groups ? std::string("dnn_group") : "g" + std::to_string(g);
    args.push_back("--group");
    args.push_back(group + "=" + std::to_string(perGroup) + ":" +
                   (g == groups ? "ml.p3.2xlarge"
                    : g % 2     ? "ml.c5.xlarge"
                                : "ml.m5.xlarge"));
    args.push_back("--env");
    args.push_back(group + ":TROUPE_JOIN_TIMEOUT_MS=180000");
  }
  Run run(harness::sim(args, probe("normal")));
  size_t total = size_t(groups * perGroup);
  auto n = std::to_string(total);
  CHECK(run.wait(240s) == 0);
  auto out = run.output();
  INFO(out.substr(out.size() > 6000 ? out.size() - 6000 : 0));
  std::set<std::string> addresses;
  for (auto& [host, i] : run.instances()) addresses.insert(i.address);
  CHECK(run.instances().size() == total);
  CHECK(addresses.size() == total);
  // The head's control port is none of them (troupe sim reserves it with the others).
  const std::string listening = "control path listening on port ";
  auto at = out.find(listening);
  REQUIRE(at != std::string::npos);
  auto control = "127.0.0.1:" + std::to_string(std::stoi(out.substr(at + listening.size())));
  CHECK(addresses.count(control) == 0);
  CHECK(out.find("cluster formed: " + n + " nodes; starting the driver") != std::string::npos);
  CHECK(harness::count(out, "PING ") == total);
  CHECK(out.find("troupe sim: all " + n + " instances exited 0") != std::string::npos);
  CHECK(out.find("was lost") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a silent head (SIGSTOP): workers exit HEAD_LOST after the head timeout",
          "[cluster][fault]") {
  Run run(harness::sim(with(kThree, {"--linger-ms", "1000", "--grace-ms", "1000", "--env",
                                     "data_group:TROUPE_HEAD_TIMEOUT_MS=1500"}),
                       probe("hold")));
  REQUIRE_OUTPUT(run, "READY", 30s);
  auto head = instanceIn(run, "dnn_group");
  REQUIRE(kill(head.pid, SIGSTOP) == 0);
  // Both workers give up on the head on their own (docs/exit-codes.md, HEAD_LOST) ...
  for (auto& [host, i] : run.instances()) {
    if (host == head.host) continue;
    REQUIRE_OUTPUT(run, "[" + host + " data_group worker] exiting with 3 (HEAD_LOST)", 10s);
  }
  // ... while troupe sim leaves the frozen head alone (it signals nobody while the head runs).
  std::this_thread::sleep_for(1500ms);
  CHECK(harness::processExists(head.pid));
  // Thawed, the head finds its workers gone and fails the job.
  REQUIRE(kill(head.pid, SIGCONT) == 0);
  CHECK(run.wait(20s) == 1);
  auto out = run.output();
  INFO(out);
  checkWorkersLostHead(run, head.host);
  CHECK(run.exitLine(head.host).find("exited with 1 (JOB_FAILED)") != std::string::npos);
  CHECK(out.find("no answer on the control path for ") != std::string::npos);
  // "... for 1972 ms (--head-timeout-ms 1500)", or "... ms since joining (--head-timeout-ms 1500;
  // ...)" when the head froze before its first answer (a loaded machine).
  bool afterAnswers = out.find(" ms (--head-timeout-ms 1500)") != std::string::npos;
  bool beforeFirst = out.find(" ms since joining (--head-timeout-ms 1500;") != std::string::npos;
  CHECK((afterAnswers || beforeFirst));
  CHECK(run.leftovers().empty());
}
