// troupe.data.DataLoader (docs/pytorch.md): a script's own Dataset and transforms on the data
// group's worker processes, for one trainer and for every DDP rank, run as a user runs them (the
// rest of troupe.data: pytorch_test.cpp). Skipped, with the reason on one line, where PyTorch is
// not installed for the Python the package was built for.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>

#include "harness.h"
#include "pytorch_test.h"
#include "train_job.h"

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;
using namespace pytorch_test;

namespace {

// tests/python/dataloader_check.py's epoch lines: "check: epoch E: N samples, N once, 0 missing,
// B batches, whole True, batches DIGEST". Checks each of `epochs` says every one of `samples`
// samples once in whole batches; returns the epochs' batch digests.
std::vector<std::string> checkLoaderEpochs(const std::string& out, int epochs, int samples) {
  std::vector<std::string> digests;
  for (int e = 0; e < epochs; ++e) {
    std::smatch m;
    std::regex line("check: epoch " + std::to_string(e) +
                    R"(: (\d+) samples, (\d+) once, (\d+) missing, \d+ batches, whole (\w+), )"
                    R"(batches (\w+))");
    INFO("epoch " << e);
    REQUIRE(std::regex_search(out, m, line));
    CHECK(std::stoi(m[1]) == samples);
    CHECK(std::stoi(m[2]) == samples);
    CHECK(std::stoi(m[3]) == 0);
    CHECK(m[4] == "True");
    digests.push_back(m[5]);
  }
  return digests;
}

// Each epoch's digest of its batches in the order the script got them.
std::vector<std::string> loaderSequences(const std::string& out, int epochs) {
  std::vector<std::string> digests;
  for (int e = 0; e < epochs; ++e) {
    std::smatch m;
    std::regex line("check: epoch " + std::to_string(e) + R"(: .* sequence (\w+))");
    INFO("epoch " << e);
    REQUIRE(std::regex_search(out, m, line));
    digests.push_back(m[1]);
  }
  return digests;
}

std::vector<std::string> loaderCheck(std::vector<std::string> args) {
  std::vector<std::string> argv = {PYTHON3, DATALOADER_CHECK};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace

TEST_CASE("troupe.data.DataLoader feeds a script's own Dataset from the data group: every sample "
          "once in whole batches, the same batches as under plain python3",
          "[pytorch][dataloader]") {
  SKIP_WITHOUT_TORCH();
  // Plain python3 (no cluster): torch's DataLoader on this machine, saying so.
  Run local(loaderCheck({"plain"}), pythonEnv());
  REQUIRE(local.wait(120s) == 0);
  auto localOut = local.output();
  INFO(localOut);
  CHECK(localOut.find("troupe.data: not in a troupe cluster: torch's DataLoader with") !=
        std::string::npos);
  auto alone = checkLoaderEpochs(localOut, 3, 1000);
  // On make run's cluster: the Dataset's workers on the data instances.
  Run run(harness::sim(kCluster, loaderCheck({"plain"})), pythonEnv());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("check: len 16") != std::string::npos);
  auto fed = checkLoaderEpochs(out, 3, 1000);
  // Batch k of an epoch holds the same samples whoever makes it (seed 7, shuffle=True).
  CHECK(fed == alone);
  CHECK(fed[0] != fed[1]);
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe.data.DataLoader(in_order=True): the batches reach the script in the epoch's "
          "order, as torch's DataLoader hands them",
          "[pytorch][dataloader]") {
  SKIP_WITHOUT_TORCH();
  Run local(loaderCheck({"order"}), pythonEnv());
  REQUIRE(local.wait(120s) == 0);
  auto localOut = local.output();
  INFO(localOut);
  auto alone = loaderSequences(localOut, 3);
  Run run(harness::sim(kCluster, loaderCheck({"order"})), pythonEnv());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  checkLoaderEpochs(out, 3, 1000);
  // The same batches in the same sequence as torch's own DataLoader under plain python3.
  CHECK(loaderSequences(out, 3) == alone);
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe.data.DataLoader: a data instance killed mid-epoch, one of its worker processes, "
          "or its fork server - every sample once, counted in the script",
          "[pytorch][dataloader][fault]") {
  SKIP_WITHOUT_TORCH();
  SECTION("SIGKILL to a data instance") {
    Run run(harness::sim(kCluster, loaderCheck({"slow", "3000"})), pythonEnv());
    REQUIRE_OUTPUT(run, "check: epoch 0 past batch 5", 120s);
    auto victim = harness::instanceIn(run, "data_group");
    REQUIRE(kill(victim.pid, SIGKILL) == 0);
    int code = run.wait(240s);
    auto out = run.output();
    INFO(out);
    CHECK(harness::headDoneHostKilled(code, out));
    checkLoaderEpochs(out, 3, 3000);
    CHECK(run.leftovers().empty());
  }
  SECTION("SIGKILL to a DataLoader worker process of a data instance") {
    Run run(harness::sim(kCluster, loaderCheck({"slow", "3000"})), pythonEnv());
    REQUIRE_OUTPUT(run, "check: epoch 0 past batch 5", 120s);
    auto victim = harness::instanceIn(run, "data_group");
    // Its workers are the children of its one child, the DataLoader's fork server (forked before
    // the runtime started).
    auto children = [](int pid) {
      return harness::readFile("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                               "/children");
    };
    std::istringstream server(children(victim.pid));
    int forkServer = 0;
    REQUIRE(server >> forkServer);
    std::istringstream pids(children(forkServer));
    INFO("children of " << victim.pid << ": " << children(victim.pid) << "; of its fork server "
                        << forkServer << ": " << children(forkServer));
    int worker = 0;
    REQUIRE(pids >> worker);
    REQUIRE(kill(worker, SIGKILL) == 0);
    int code = run.wait(240s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("(pid " + std::to_string(worker) + ") died of signal 9 (Killed); its ") !=
          std::string::npos);
    checkLoaderEpochs(out, 3, 3000);
    CHECK(run.leftovers().empty());
  }
  SECTION("SIGKILL to a data instance's DataLoader fork server: its workers end with it, the other "
          "instance takes its shards") {
    Run run(harness::sim(kCluster, loaderCheck({"slow", "3000"})), pythonEnv());
    REQUIRE_OUTPUT(run, "check: epoch 0 past batch 5", 120s);
    auto victim = harness::instanceIn(run, "data_group");
    std::istringstream server(harness::readFile("/proc/" + std::to_string(victim.pid) + "/task/" +
                                                std::to_string(victim.pid) + "/children"));
    int forkServer = 0;
    REQUIRE(server >> forkServer);
    REQUIRE(kill(forkServer, SIGKILL) == 0);
    int code = run.wait(240s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("on " + victim.host + " has died and none could start again: the DataLoader's "
                   "fork server") != std::string::npos);
    checkLoaderEpochs(out, 3, 3000);
    CHECK(run.leftovers().empty());
  }
}

TEST_CASE("troupe.data.DataLoader: an exception in __getitem__ fails the job naming the index, "
          "a break leaves the epoch, bad arguments are Python's errors",
          "[pytorch][dataloader][bad-input]") {
  SKIP_WITHOUT_TORCH();
  SECTION("dataset[123] raises") {
    auto cluster = kCluster;
    cluster.insert(cluster.begin(), "--keep");
    Run run(harness::sim(cluster, loaderCheck({"fail"})), pythonEnv());
    int code = run.wait(120s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 1);
    auto failure = headFailure(run);
    INFO("output/failure: " << failure);
    CHECK(failure.find("dataset[123] raised ValueError: sample 123 is bad on purpose") !=
          std::string::npos);
    CHECK(failure.find("Traceback") != std::string::npos);
    CHECK(failure.find("exit code 1 (JOB_FAILED)") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("dataset[123] and dataset[500] raise, skip_errors=True: left out, counted as skipped") {
    Run run(harness::sim(kCluster, loaderCheck({"skip"})), pythonEnv());
    int code = run.wait(120s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    for (int e : {0, 1, 2}) {
      auto epoch = "check: epoch " + std::to_string(e);
      CHECK(out.find(epoch + ": 998 samples, 998 once, 2 missing") != std::string::npos);
      CHECK(out.find(epoch + " report: 998 samples, 0 missing, 2 skipped: dataset[123] raised "
                             "ValueError: sample 123 is bad on purpose; dataset[500] raised "
                             "ValueError: sample 500 is bad on purpose") != std::string::npos);
    }
    CHECK(run.leftovers().empty());
  }
  SECTION("a break out of epoch 0: epoch 1 whole, nothing of epoch 0 in it") {
    Run run(harness::sim(kCluster, loaderCheck({"break"})), pythonEnv());
    int code = run.wait(120s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("check: epoch 0 left after 3 batches") != std::string::npos);
    // The trainer's report of epoch 0: the 3 batches the script took trained, the rest
    // abandoned (made or not, never handed to it), none missing.
    CHECK(out.find("check: epoch 0 report: 192 samples, 808 abandoned, 0 missing") !=
          std::string::npos);
    CHECK(out.find("check: epoch 0's iterator after epoch 1: RuntimeError: DataLoader: this "
                   "iterator's epoch 0 was left when iter(loader) started epoch 1: two live "
                   "iterators") != std::string::npos);
    std::smatch m;
    for (int e : {1, 2}) {
      std::regex line("check: epoch " + std::to_string(e) +
                      R"(: 1000 samples, 1000 once, 0 missing, 16 batches, whole True)");
      CHECK(std::regex_search(out, m, line));
    }
    CHECK(run.leftovers().empty());
  }
  SECTION("bad arguments") {
    Run run(loaderCheck({"types"}), pythonEnv());
    int code = run.wait(60s);
    INFO(run.output());
    CHECK(code == 0);
    CHECK(run.output().find("check: types ok") != std::string::npos);
  }
}

// ddp_check.py's epochs as rank 0 gathered them: `samples` samples, every one once over the 2
// ranks, `steps` steps each, whole batches but each rank's last, no sample on both.
void checkRanksEpochs(const std::string& out, int samples = 1000, int steps = 16) {
  for (int e : {0, 1, 2}) {
    std::smatch m;
    std::regex line("check: epoch " + std::to_string(e) +
                    R"(: (\d+) samples, (\d+) once, (\d+) missing, steps per rank \[)" +
                    std::to_string(steps) + ", " + std::to_string(steps) +
                    R"(\], whole True, disjoint True)");
    INFO("epoch " << e);
    CHECK(std::regex_search(out, m, line));
    if (!m.empty()) {
      CHECK(m[1] == std::to_string(samples));
      CHECK(m[2] == std::to_string(samples));
      CHECK(m[3] == "0");
    }
  }
}

// The process of local rank 1 on the dnn instance of `run` (TROUPE_PROCS_PER_HOST=2): the child
// of the instance's troupe process that it started again for that rank; 0 when none.
int localRankProcess(Run& run) {
  auto dnn = harness::instanceIn(run, "dnn_group");
  auto children = harness::readFile("/proc/" + std::to_string(dnn.pid) + "/task/" +
                                    std::to_string(dnn.pid) + "/children");
  std::istringstream pids(children);
  for (int pid = 0; pids >> pid;) {
    auto env = harness::readFile("/proc/" + std::to_string(pid) + "/environ");
    if (env.find("TROUPE_LOCAL_PARENT=") != std::string::npos) return pid;
  }
  WARN("no local rank among the children of " << dnn.pid << ": " << children);
  return 0;
}

// The cluster of make run with two dnn instances: two DDP ranks, one process each.
const std::vector<std::string> kTwoRanks = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                            "dnn_group=2:ml.p3.2xlarge"};

TEST_CASE("troupe.data.DataLoader feeds every DDP rank: torch.distributed (gloo) set up by troupe, "
          "a disjoint share each, the same steps, every sample once across the ranks",
          "[pytorch][dataloader][ddp]") {
  SKIP_WITHOUT_TORCH();
  // ddp_check.py's 3 epochs of a DDP model on `cluster` of `instances`, rank 1 being local rank
  // `rank1Local` of its instance.
  auto trains = [](const std::vector<std::string>& cluster, int instances, int rank1Local) {
    Run run(harness::sim(cluster, {PYTHON3, DDP_CHECK, "train", "1000"}), pythonEnv());
    int code = run.wait(300s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("troupe sim: all " + std::to_string(instances) + " instances exited 0") !=
          std::string::npos);
    // Both ranks saw troupe's environment, the same length (1000 samples at 32: 15 rounds of two
    // whole batches, the 40 left split 20 and 20).
    CHECK(out.find("check: rank 0 of 2, RANK=0 LOCAL_RANK=0, len 16") != std::string::npos);
    CHECK(out.find("check: rank 1 of 2, RANK=1 LOCAL_RANK=" + std::to_string(rank1Local) +
                   ", len 16") != std::string::npos);
    // gloo's sockets on the interface that reaches rank 0 (troupe sim's nodes: loopback).
    CHECK(out.find("len 16, gloo on lo") != std::string::npos);
    CHECK(out.find("gloo on None") == std::string::npos);
    checkRanksEpochs(out);
    CHECK(out.find("check: parameters the same on every rank: True") != std::string::npos);
    // The validation loader, a DistributedSampler made after init_process_group(): each rank its
    // 100 of the 200, every epoch in another order (set_epoch).
    std::vector<std::string> firsts;
    for (int e : {0, 1, 2}) {
      std::smatch m;
      std::regex line("check: epoch " + std::to_string(e) +
                      R"(: validation 200 samples, 200 distinct, \[100, 100\] per rank, first )"
                      R"((\[[0-9, ]+\]))");
      INFO("epoch " << e);
      CHECK(std::regex_search(out, m, line));
      if (!m.empty()) firsts.push_back(m[1]);
    }
    CHECK((firsts.size() == 3 && (firsts[0] != firsts[1] || firsts[1] != firsts[2])));
    CHECK(run.leftovers().empty());
  };
  SECTION("2 dnn instances, a rank each: 3 epochs of a DDP model") { trains(kTwoRanks, 4, 0); }
  SECTION("1 dnn instance, 2 processes (TROUPE_PROCS_PER_HOST=2): 3 epochs of a DDP model") {
    trains({"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
            "--env", "dnn_group:TROUPE_PROCS_PER_HOST=2"},
           3, 1);
  }
  SECTION("the second process of the dnn instance killed (SIGKILL) mid-epoch: the job fails "
          "naming the rank") {
    std::vector<std::string> cluster = {"--keep", "--group", "data_group=2:ml.c5.xlarge",
                                        "--group", "dnn_group=1:ml.p3.2xlarge", "--env",
                                        "dnn_group:TROUPE_PROCS_PER_HOST=2"};
    Run run(harness::sim(cluster, {PYTHON3, DDP_CHECK, "slow", "3000"}), pythonEnv());
    REQUIRE_OUTPUT(run, "check: rank 1 past step 5 of epoch 0", 180s);
    int victim = localRankProcess(run);
    REQUIRE(victim != 0);
    REQUIRE(kill(victim, SIGKILL) == 0);
    int code = run.wait(240s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 1);
    auto failure = headFailure(run);
    INFO("output/failure: " << failure);
    CHECK(failure.find("DDP rank 1 of 2: the training script failed: the process of local rank 1 "
                       "(pid " + std::to_string(victim) + ") was killed by signal 9") !=
          std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("rank 1's script raises in epoch 1: the job fails naming the rank") {
    auto cluster = kTwoRanks;
    cluster.insert(cluster.begin(), "--keep");
    Run run(harness::sim(cluster, {PYTHON3, DDP_CHECK, "raise", "1000"}), pythonEnv());
    int code = run.wait(300s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 1);
    auto failure = headFailure(run);
    INFO("output/failure: " << failure);
    CHECK(failure.find("DDP rank 1 of 2: the training script failed: RuntimeError") !=
          std::string::npos);
    CHECK(failure.find("rank 1 fails on purpose") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
}

// A spot reclaim under DDP: SIGTERM to every instance at a random moment inside epoch 0. Each
// rank's loader agrees with the others on the step they stop at (an all-reduce before each item):
// a rank that stopped alone left the others in their gradients' all-reduce until SIGKILL, every
// instance 137. Then the job again, each rank from its own state_dict().
TEST_CASE("SIGTERM to every instance under DDP: every rank stops at the same step and saves, "
          "every instance exits 6, and the job run again resumes each rank, every sample once",
          "[pytorch][dataloader][ddp][resume]") {
  SKIP_WITHOUT_TORCH();
  auto cycle = [](std::vector<std::string> cluster, int instances, const std::string& name) {
    auto dir = tempPath(name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto seed = std::random_device()();
    for (auto arg : {"--interrupt-when", "check: rank 1 past step 5 of epoch 0",
                     "--interrupt-random-ms", "0:300", "--restarts-on-interrupt", "1"}) {
      cluster.push_back(arg);
    }
    cluster.insert(cluster.end(), {"--interrupt-seed", std::to_string(seed)});
    Run run(harness::sim(cluster, {PYTHON3, DDP_CHECK, "stop", "3000", dir}), pythonEnv());
    int code = run.wait(300s);
    auto out = "--interrupt-seed " + std::to_string(seed) + "\n" + run.output();
    INFO(out);
    CHECK(code == 0);
    REQUIRE(out.find("troupe sim: interrupting the job as a spot reclaim does") !=
            std::string::npos);
    CHECK(out.find("run 1 ended with 6 (INTERRUPTED) after the interruption") !=
          std::string::npos);
    // Both ranks stopped after the same step of the same epoch, and resumed from there.
    std::map<int, std::string> stopped, resumed;
    static const std::regex stop(R"(check: rank (\d) stopped after (step \d+ of epoch \d+))");
    static const std::regex resume(R"(check: rank (\d) resumed after (step \d+ of epoch \d+))");
    for (std::sregex_iterator it(out.begin(), out.end(), stop), end; it != end; ++it) {
      stopped[std::stoi((*it)[1])] = (*it)[2];
    }
    for (std::sregex_iterator it(out.begin(), out.end(), resume), end; it != end; ++it) {
      resumed[std::stoi((*it)[1])] = (*it)[2];
    }
    REQUIRE(stopped.size() == 2);
    CHECK(stopped[0] == stopped[1]);
    CHECK(resumed == stopped);
    // The script's own count across both runs: every epoch's samples once, the same steps.
    checkRanksEpochs(out, 3000, 47);
    CHECK(out.find("check: parameters the same on every rank: True") != std::string::npos);
    CHECK(out.find("troupe sim: all " + std::to_string(instances) + " instances exited 0") !=
          std::string::npos);
    CHECK(run.leftovers().empty());
    std::filesystem::remove_all(dir);
  };
  SECTION("2 dnn instances, a rank each") { cycle(kTwoRanks, 4, "ddp-stop-2x1"); }
  SECTION("1 dnn instance, 2 processes") {
    cycle({"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
           "--env", "dnn_group:TROUPE_PROCS_PER_HOST=2"},
          3, "ddp-stop-1x2");
  }
}

// A rank lost without warning: its process killed at a random moment past step 25 of epoch 0.
// The other rank, waiting in an all-reduce, saves nothing; the states every rank saved every 10
// steps are what the job run again resumes from.
TEST_CASE("a DDP rank's process killed mid-epoch fails the job naming the rank, and the job run "
          "again resumes every rank from the newest step all saved, every sample once",
          "[pytorch][dataloader][ddp][resume]") {
  SKIP_WITHOUT_TORCH();
  auto dir = tempPath("ddp-kill");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::string> cluster = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                      "dnn_group=1:ml.p3.2xlarge", "--env",
                                      "dnn_group:TROUPE_PROCS_PER_HOST=2"};
  auto seed = std::random_device()();
  std::mt19937 rng(seed);
  auto delayMs = std::uniform_int_distribution<int>(0, 300)(rng);
  INFO("seed " << seed << ": the kill " << delayMs << " ms past step 25");
  Run first(harness::sim(cluster, {PYTHON3, DDP_CHECK, "stop", "3000", dir}), pythonEnv());
  REQUIRE_OUTPUT(first, "check: rank 1 past step 25 of epoch 0", 180s);
  std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
  int victim = localRankProcess(first);
  REQUIRE(victim != 0);
  REQUIRE(kill(victim, SIGKILL) == 0);
  CHECK(first.wait(240s) == 1);
  auto out = first.output();
  INFO(out);
  CHECK(out.find("DDP rank 1 of 2: the training script failed: the process of local rank 1") !=
        std::string::npos);
  CHECK(first.leftovers().empty());

  Run again(harness::sim(cluster, {PYTHON3, DDP_CHECK, "stop", "3000", dir}), pythonEnv());
  CHECK(again.wait(300s) == 0);
  auto out2 = again.output();
  INFO(out2);
  std::smatch m0, m1;
  static const std::regex rank0(R"(check: rank 0 resumed after (step \d+ of epoch 0))");
  static const std::regex rank1(R"(check: rank 1 resumed after (step \d+ of epoch 0))");
  REQUIRE(std::regex_search(out2, m0, rank0));
  REQUIRE(std::regex_search(out2, m1, rank1));
  CHECK(m0[1] == m1[1]);
  WARN("the job run again: both ranks resumed after " << m0[1] << " (seed " << seed << ")");
  CHECK(std::stoi(m0[1].str().substr(5)) >= 20);  // a state of step 20 or later: saved past 25
  checkRanksEpochs(out2, 3000, 47);
  CHECK(out2.find("troupe sim: all 3 instances exited 0") != std::string::npos);
  CHECK(again.leftovers().empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("troupe's native module imports and answers without PyTorch", "[pytorch][native]") {
  // No skip: a package that does not import is a failure, torch or not.
  Run run({PYTHON3, "-c",
           "from troupe import _native\n"
           "order = _native.epoch_order(10, 7, 0, True)[0].tolist()\n"
           "assert sorted(order) == list(range(10)), order\n"
           "shares = [_native.epoch_order(10, 7, 0, True, 4, False, r, 3) for r in range(3)]\n"
           "ids = sum((s[0].tolist() for s in shares), [])\n"
           "assert sorted(ids) == list(range(10)) and [s[1] for s in shares] == [3, 3, 4], shares\n"
           "print('native ok', order)\n"},
          pythonEnv());
  int code = run.wait(60s);
  INFO(run.output());
  CHECK(code == 0);
  CHECK(run.output().find("native ok") != std::string::npos);
}

TEST_CASE("a torch DataLoader script outside the tree, one line changed (and the import), trains "
          "with torchvision's transforms on the data group",
          "[pytorch][dataloader][example]") {
  SKIP_WITHOUT_TORCH();
  SKIP_WITHOUT_TORCHVISION();
  // The user's script (examples/pytorch/train_images_plain.py), copied out of the tree and
  // changed as docs/pytorch.md says: torch's DataLoader becomes troupe.data's, its arguments as
  // they were (num_workers=4: four workers on each data instance).
  auto dir = tempPath("dataloader-example");
  fs::remove_all(dir);
  fs::create_directories(dir);
  Run made({MAKE_IMAGES, dir + "/data", "--samples", "2000", "--test-samples", "500"});
  REQUIRE(made.wait(60s) == 0);
  auto plain = harness::readFile(IMAGES_EXAMPLE_PLAIN);
  auto from = std::string("torch.utils.data.DataLoader(train, args.batch_size, shuffle=True, "
                          "num_workers=4)");
  auto at = plain.find(from);
  REQUIRE(at != std::string::npos);
  auto mine = plain;
  mine.replace(at, from.size(),
               "troupe.data.DataLoader(train, args.batch_size, shuffle=True, num_workers=4)");
  auto imports = mine.find("import torchvision\n");
  REQUIRE(imports != std::string::npos);
  mine.insert(imports, "import troupe.data\n");
  std::ofstream(dir + "/mine.py") << mine;
  Run run(harness::sim(kCluster, {PYTHON3, dir + "/mine.py", dir + "/data", "--epochs", "2"}),
          pythonEnv());
  int code = run.wait(300s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex(R"(epoch 2/2: 2000 samples, 32 steps .* test )"
                                               R"(accuracy ([0-9.]+))")));
  CHECK(std::stod(m[1]) > 0.3);  // chance: 0.1
  CHECK(out.find("epoch 1/2: 2000 samples, 32 steps") != std::string::npos);
  fs::remove_all(dir);
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe.data.DataLoader over a troupe.data.ImageDataset takes troupe's C++ decoding "
          "and transforms on the data group",
          "[pytorch][dataloader][images]") {
  SKIP_WITHOUT_TORCH();
  auto dir = tempPath("dataloader-imagedataset");
  fs::remove_all(dir);
  fs::create_directories(dir);
  Run made({MAKE_IMAGES, dir + "/data", "--samples", "1000", "--test-samples", "0"});
  REQUIRE(made.wait(60s) == 0);
  std::ofstream(dir + "/mine.py") << R"py(import sys
import torch
import troupe.data

ds = troupe.data.ImageDataset(sys.argv[1], "RandomResizedCrop(32),Normalize(imagenet)", seed=1)
loader = troupe.data.DataLoader(ds, batch_size=100, shuffle=True, with_ids=True)
for epoch in range(2):
    seen = []
    for (x, y), ids in loader:
        assert x.shape[1:] == (3, 32, 32) and x.dtype == torch.float32, x.shape
        assert y.dtype == torch.int64 and len(y) == len(ids)
        seen += ids.tolist()
    print(f"mine: epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct", flush=True)
)py";
  Run run(harness::sim(kCluster, {PYTHON3, dir + "/mine.py", dir + "/data/train"}), pythonEnv());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("mine: epoch 0: 1000 samples, 1000 distinct") != std::string::npos);
  CHECK(out.find("mine: epoch 1: 1000 samples, 1000 distinct") != std::string::npos);
  fs::remove_all(dir);
  CHECK(run.leftovers().empty());
}


TEST_CASE("a torchrun DDP script outside the tree, its DataLoader statement changed, trains under "
          "troupe sim alone and as 2 DDP ranks, every sample once an epoch as the script counts",
          "[pytorch][dataloader][ddp][example]") {
  SKIP_WITHOUT_TORCH();
  // The user's script (examples/pytorch/train_ddp_plain.py), copied out of the tree. First as
  // torchrun runs it: two processes with the environment torchrun sets (Debian's torchrun 1.13
  // itself does not start under Python 3.11).
  auto dir = tempPath("ddp-example");
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto plain = harness::readFile(DDP_EXAMPLE_PLAIN);
  std::ofstream(dir + "/plain.py") << plain;
  const std::vector<std::string> args = {"--samples", "1000", "--epochs", "3"};
  auto epochLine = [](int epoch, const std::string& steps) {
    return std::regex("epoch " + std::to_string(epoch) + "/3: 1000 samples, 1000 distinct of " +
                      "1000, steps per rank \\[" + steps + "\\], train accuracy ([0-9.]+)");
  };
  auto checkEpochs = [&](const std::string& out, const std::string& steps) {
    for (int e = 1; e <= 3; ++e) {
      INFO("epoch " << e);
      std::smatch m;
      REQUIRE(std::regex_search(out, m, epochLine(e, steps)));
      if (e == 3) CHECK(std::stod(m[1]) > 0.5);  // four classes: chance 0.25
    }
  };
  {
    std::random_device seed;
    auto port = std::to_string(20000 + seed() % 20000);
    std::vector<std::unique_ptr<Run>> ranks;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> argv = {PYTHON3, dir + "/plain.py"};
      argv.insert(argv.end(), args.begin(), args.end());
      ranks.push_back(std::make_unique<Run>(
          argv, std::vector<std::string>{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                         "RANK=" + std::to_string(r), "WORLD_SIZE=2",
                                         "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2"}));
    }
    CHECK(ranks[1]->wait(240s) == 0);
    CHECK(ranks[0]->wait(60s) == 0);
    auto out = ranks[0]->output();
    INFO("torch's own launch, rank 0:\n" << out << "\nrank 1:\n" << ranks[1]->output());
    checkEpochs(out, "16, 16");
  }
  // The one statement docs/pytorch.md changes: torch's DataLoader (and its DistributedSampler)
  // becomes troupe.data's.
  auto from = std::string(
      "DataLoader(dataset, args.batch_size, num_workers=2, sampler=DistributedSampler(\n"
      "        dataset, num_replicas=int(os.environ[\"WORLD_SIZE\"]), "
      "rank=int(os.environ[\"RANK\"])))");
  auto at = plain.find(from);
  REQUIRE(at != std::string::npos);
  auto mine = plain;
  mine.replace(at, from.size(), "troupe.data.DataLoader(dataset, args.batch_size, shuffle=True)");
  auto imports = mine.find("import torch\n");
  REQUIRE(imports != std::string::npos);
  mine.insert(imports, "import troupe.data\n");
  std::ofstream(dir + "/mine.py") << mine;
  std::vector<std::string> app = {PYTHON3, dir + "/mine.py"};
  app.insert(app.end(), args.begin(), args.end());
  // Alone (one dnn instance, one rank: troupe sets what torchrun sets for one process), then 2
  // dnn instances, 2 DDP ranks.
  for (auto [cluster, instances, steps] :
       {std::make_tuple(kCluster, 3, "32"), std::make_tuple(kTwoRanks, 4, "16, 16")}) {
    Run run(harness::sim(cluster, app), pythonEnv());
    int code = run.wait(300s);
    auto out = run.output();
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("troupe sim: all " + std::to_string(instances) + " instances exited 0") !=
          std::string::npos);
    CHECK((out.find("troupe.data: DDP rank 1 of 2") != std::string::npos) == (instances == 4));
    checkEpochs(out, steps);
    CHECK(run.leftovers().empty());
  }
  fs::remove_all(dir);
}
