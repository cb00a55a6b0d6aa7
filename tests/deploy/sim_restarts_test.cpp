// `troupe sim --node-restarts N` as the per-instance entry points (deploy/sagemaker/train,
// troupe-node) restart a worker's process: it says when a host's restarts are used up, never
// restarts a stop, and a process stopped in its first moments (started again, not yet rejoined)
// is drained, 0, instead of killed by the signal (143) and started again (issue 49).
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "deploy_util.h"

using namespace std::chrono_literals;
using deploy::count;

namespace {

// Two data instances: the job goes on without one (hetero_train fails a job whose every
// augmenter is gone).
const std::vector<std::string> kCluster = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                           "dnn_group=1:ml.p3.2xlarge"};
// Long enough for a kill, a restart and a rejoin inside it, short enough to end well within the
// tests' wait on a loaded machine: with one data host left (0.5 CPU under the sim's CPU shares)
// and an image build beside the suite, an epoch of 12,000 samples took 5 s, the job 110 s (CI);
// one of 4,000 about 1.8 s. A data host lost is its augmenters' restart elsewhere, not the job's
// end, and the job ends 0 on its own.
const std::vector<std::string> kTrain = {HETERO_TRAIN, "--epochs", "20", "--train-samples", "4000"};

// The pid of `host`'s process of incarnation `incarnation`, from the simulator's start line.
pid_t pidOf(const std::string& out, const std::string& host, int incarnation) {
  std::smatch m;
  std::regex line("troupe sim: " + host + R"( +data_group .* pid=([0-9]+).* incarnation=)" +
                  std::to_string(incarnation) + "\n");
  return std::regex_search(out, m, line) ? pid_t(std::stol(m[1])) : 0;
}

// A job of kTrain with --node-restarts `restarts`, its data host `victim` killed (SIGKILL) once
// the first epoch is done.
std::unique_ptr<harness::Run> killedOnce(const std::string& restarts, harness::Instance& victim) {
  auto args = kCluster;
  args.insert(args.end(), {"--node-restarts", restarts});
  auto run = std::make_unique<harness::Run>(harness::sim(args, kTrain));
  REQUIRE_OUTPUT(*run, "epoch 1/", 60s);
  victim = harness::instanceIn(*run, "data_group");
  REQUIRE(victim.pid > 0);
  REQUIRE(kill(victim.pid, SIGKILL) == 0);
  return run;
}

}  // namespace

TEST_CASE(
    "sim --node-restarts: a data host's restarts used up are said, the host ending with "
    "its code",
    "[sim][restarts]") {
  harness::Instance victim;
  auto started = killedOnce("1", victim);
  auto& run = *started;
  REQUIRE_OUTPUT(run, "starting it again (restart 1 of 1)", 30s);
  REQUIRE_OUTPUT(run, "rejoined (incarnation 1)", 30s);
  auto again = pidOf(run.output(), victim.host, 1);
  REQUIRE(again > 0);
  REQUIRE(kill(again, SIGKILL) == 0);
  CHECK(run.wait(100s) == 137);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("troupe sim: " + victim.host +
                 " (data_group) was killed by signal 9 (Killed); "
                 "no restarts left (--node-restarts 1): this host ends 137") != std::string::npos);
  CHECK(count(out, "starting it again") == 1);
  CHECK(run.leftovers().empty());
}

TEST_CASE(
    "sim --node-restarts: SIGTERM to a worker started again, in its first moments, drains "
    "it (0) and is never restarted",
    "[sim][restarts]") {
  harness::Instance victim;
  auto started = killedOnce("2", victim);
  auto& run = *started;
  // The stop as soon as the new process is past the sim's own starter (troupe __exec-held, a few
  // milliseconds): while hetero_train's libraries load (it used to die of the signal, 143, and be
  // started again) or while it rejoins.
  pid_t again = 0;
  for (auto until = std::chrono::steady_clock::now() + 30s;
       again == 0 && std::chrono::steady_clock::now() < until;) {
    again = pidOf(run.output(), victim.host, 1);
    if (again == 0) std::this_thread::sleep_for(2ms);
  }
  REQUIRE(again > 0);
  // Past the starter: /proc/PID/exe is no longer the troupe binary (it exec'd the cgroup's shell
  // or hetero_train with the stops held). Its own loading is the window left (milliseconds).
  auto troupe = std::filesystem::canonical(TROUPE_BINARY);
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until;) {
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(again) + "/exe", ec);
    if (!ec && exe != troupe) break;
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(kill(again, SIGTERM) == 0);
  CHECK(run.wait(100s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(count(out, "starting it again") == 1);  // the SIGKILL's restart only
  CHECK(out.find("drained") != std::string::npos);
  CHECK(out.find("ran 2 processes (exit codes 137, 0): final 0") != std::string::npos);
  CHECK(run.leftovers().empty());
}
