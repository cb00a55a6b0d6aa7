// `troupe sim` as SageMaker's managed spot training: --checkpoints is every instance's
// <root>/checkpoints and outlives the run; --interrupt-* SIGTERMs (or SIGKILLs) every instance at
// a given or seeded random moment, and --restarts-on-interrupt starts the job again.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "deploy_util.h"

using namespace std::chrono_literals;
using deploy::count;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kCluster = {"--group", "data_group=1:ml.c5.xlarge", "--group",
                                           "dnn_group=1:ml.p3.2xlarge"};

std::vector<std::string> with(std::vector<std::string> extra) {
  auto args = kCluster;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The roots folder of the latest run the simulator printed.
std::string latestRoots(const std::string& out) {
  std::string roots;
  std::regex line(R"(roots in (\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    roots = (*it)[1];
  return roots;
}

}  // namespace

TEST_CASE(
    "sim --interrupt-after-ms SIGTERMs every instance like a spot reclaim and "
    "--restarts-on-interrupt starts the job again with the same checkpoints folder",
    "[sim][spot]") {
  roots::TempDir dir;
  auto checkpoints = fs::path(dir.path()) / "ck";
  harness::Run run(
      harness::sim(with({"--hp", "hold_ms=60000", "--checkpoints", checkpoints.string(),
                         "--interrupt-after-ms", "1500", "--restarts-on-interrupt", "1"}),
                   {deploy::smApp()}));
  REQUIRE_OUTPUT(run, "starting the job again on new instances (restart 1 of 1)", 60s);
  // The second run is up once its head pinged every node (the first run's pings came before).
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (count(run.output(), "PING algo-") < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  auto out = run.output();
  REQUIRE(count(out, "PING algo-") == 4);
  // Every instance of the second run sees the one folder as its <root>/checkpoints, as SageMaker
  // syncs checkpoint_s3_uri into /opt/ml/checkpoints before the job starts again.
  auto roots = latestRoots(out);
  CHECK(roots.find("/run-2") != std::string::npos);
  for (auto host : {"algo-1", "algo-2"}) {
    CHECK(fs::read_symlink(fs::path(roots) / host / "checkpoints") == checkpoints);
  }
  REQUIRE(kill(run.pid(), SIGTERM) == 0);  // a person's SIGTERM: no restart after it
  int code = run.wait(30s);
  out = run.output();
  INFO(out);
  CHECK(out.find("troupe sim: run 1 will be interrupted 1500 ms after it starts") !=
        std::string::npos);
  CHECK(out.find("troupe sim: interrupting the job as a spot reclaim does: SIGTERM to every "
                 "instance") != std::string::npos);
  // docs/exit-codes.md: the interrupted run ends with 6 (INTERRUPTED) on every instance, and so
  // does the second, which the test stopped.
  CHECK(out.find("run 1 ended with 6 (INTERRUPTED) after the interruption") != std::string::npos);
  CHECK(count(out, "exited with 6 (INTERRUPTED)") == 4);
  CHECK(code == 6);
  CHECK(count(out, "restart 1 of 1") == 1);
  CHECK(fs::is_directory(checkpoints));  // the folder outlives the job
  CHECK(run.leftovers().empty());
}

TEST_CASE(
    "sim --interrupt-hard SIGKILLs every instance: no grace period, no restart without "
    "--restarts-on-interrupt",
    "[sim][spot]") {
  harness::Run run(harness::sim(
      with({"--hp", "hold_ms=60000", "--interrupt-after-ms", "1000", "--interrupt-hard"}),
      {deploy::smApp()}));
  int code = run.wait(60s);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("SIGKILL to every instance (capacity lost, no grace period)") !=
        std::string::npos);
  CHECK(code == 137);  // docs/exit-codes.md: the head killed by a signal, 128 + 9
  CHECK(count(out, "exited with 137") == 2);
  CHECK(out.find("starting the job again") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("sim --interrupt-random-ms draws the same moment from the same seed and prints both",
          "[sim][spot]") {
  // A seed replays a failure: the moment is mt19937's, the same on every machine.
  std::string moments[2];
  for (auto& moment : moments) {
    harness::Run run(
        harness::sim(with({"--interrupt-random-ms", "60000:120000", "--interrupt-seed", "12345"}),
                     {deploy::smApp()}));
    REQUIRE(run.wait(60s) == 0);  // done long before the moment: not interrupted
    auto out = run.output();
    INFO(out);
    std::smatch m;
    REQUIRE(std::regex_search(
        out, m,
        std::regex(
            R"(run 1 will be interrupted (\d+) ms after it starts \(--interrupt-seed 12345\))")));
    moment = m[1];
    CHECK(out.find("interrupting the job") == std::string::npos);
    CHECK(run.leftovers().empty());
  }
  CHECK(moments[0] == moments[1]);
  CHECK(std::stoul(moments[0]) >= 60000);
  CHECK(std::stoul(moments[0]) <= 120000);
}

TEST_CASE("sim spot options that cannot work are refused with exit 2", "[sim][spot]") {
  // docs/exit-codes.md: CONFIG_ERROR, nothing started, the option named.
  auto refused = [](std::vector<std::string> args, const std::string& says) {
    harness::Run run(harness::sim(with(args), {deploy::smApp()}));
    CHECK(run.wait(30s) == 2);
    auto out = run.output();
    INFO(out);
    CHECK(out.find(says) != std::string::npos);
    CHECK(out.find("pid=") == std::string::npos);
  };
  refused({"--restarts-on-interrupt", "1"}, "need --interrupt-after-ms or --interrupt-random-ms");
  refused({"--interrupt-random-ms", "5:1"}, "--interrupt-random-ms '5:1': expected MIN:MAX");
  refused({"--interrupt-random-ms", "1:5", "--interrupt-after-ms", "3"}, "give one");
  // "-1" once parsed as 2^64-1 and the draw divided by zero (SIGFPE, the secret file left behind).
  refused({"--interrupt-random-ms", "0:-1"},
          "--interrupt-random-ms '0:-1': '-1' is not a number of milliseconds from 0 to 86400000");
  refused({"--interrupt-random-ms", "5x:10"}, "'5x' is not a number of milliseconds");
  refused({"--interrupt-random-ms", "0:4294967296"}, "'4294967296' is not a number");
}

TEST_CASE("sim refuses an unknown option, naming it, instead of dropping it and what follows",
          "[sim][bad-input]") {
  // It once ran the default cluster: `--frobnicate 1 --group a=1` vanished before the "--".
  auto run = [](std::vector<std::string> argv) {
    harness::Run r(argv);
    int code = r.wait(30s);
    return std::make_pair(code, r.output());
  };
  auto [code, out] =
      run({TROUPE_BINARY, "sim", "--frobnicate", "1", "--group", "a=1", "--", "/bin/true"});
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("troupe sim: unknown option '--frobnicate'; options go before the app") !=
        std::string::npos);
  std::tie(code, out) = run({TROUPE_BINARY, "sim", "--grop", "a=1", "/bin/true"});
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("unknown option '--grop' (did you mean '--group'?)") != std::string::npos);
  CHECK(out.find("instances exited") == std::string::npos);  // nothing started
}

TEST_CASE("sim refuses an empty instance type and a group given twice, starting nothing",
          "[sim][bad-input]") {
  auto refused = [](std::vector<std::string> groups, const std::string& says) {
    std::vector<std::string> argv = {TROUPE_BINARY, "sim"};
    for (auto& g : groups) argv.insert(argv.end(), {"--group", g});
    argv.insert(argv.end(), {"--", "/bin/true"});
    harness::Run run(argv);
    CHECK(run.wait(30s) == 2);
    auto out = run.output();
    INFO(out);
    CHECK(out.find(says) != std::string::npos);
    CHECK(out.find("pid=") == std::string::npos);  // no process started
  };
  refused({"a=1:"}, "--group 'a=1:': the INSTANCE_TYPE after ':' is empty");
  refused({"a=1:ml.c5.xlarge", "b=1", "a=2:ml.c5.xlarge"},
          "--group 'a=2:ml.c5.xlarge': the group 'a' is already given");
}

TEST_CASE("sim refuses --env for a host or group the cluster does not have, starting nothing",
          "[sim][bad-input]") {
  // A typo once left the variable unset on every instance, silently (issue 24).
  auto run = [](std::vector<std::string> env) {
    std::vector<std::string> argv = {TROUPE_BINARY, "sim", "--group", "data=2", "--group",
                                     "dnn=1", "--scale-up", "data=1@0"};
    for (auto& e : env) argv.insert(argv.end(), {"--env", e});
    argv.insert(argv.end(), {"--", "/bin/true"});
    harness::Run r(argv);
    int code = r.wait(30s);
    return std::make_pair(code, r.output());
  };
  auto [code, out] = run({"nosuchgroup:FOO=1"});
  INFO(out);
  CHECK(code == 2);
  CHECK(out.find("--env 'nosuchgroup:FOO=1': no host or group 'nosuchgroup' in this cluster; "
                 "name a group (data, dnn) or a host, algo-1 to algo-4") != std::string::npos);
  CHECK(out.find("pid=") == std::string::npos);
  std::tie(code, out) = run({"algo-5:FOO=1"});
  CHECK(code == 2);
  // A group, a host of the description and a scaled-up host are all names it knows.
  std::tie(code, out) = run({"dnn:FOO=1", "algo-3:FOO=2", "algo-4:FOO=3"});
  INFO(out);
  CHECK(code == 0);
}
