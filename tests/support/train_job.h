// hetero_train under `troupe sim` for the tests that hold it to its promises: its command line,
// the cluster the tests use, and its report (--report PATH, JSON).
#pragma once

#include <algorithm>

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "digest.h"
#include "harness.h"

namespace train_job {

// 2 data instances (4 vCPUs each) and the dnn instance, as `make run`.
inline const std::vector<std::string> kCluster = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                                  "dnn_group=1:ml.p3.2xlarge"};

// hetero_train's argv with `extra` flags.
// hetero_train with `extra`, and the light augmentation preset unless `extra` names one: these
// tests check the job's behaviour, not its cost, and 5 epochs of the heavy default take minutes
// under ASan. The fault matrix (tests/faults) runs make run's defaults, heavy included.
inline std::vector<std::string> train(std::vector<std::string> extra) {
  std::vector<std::string> argv = {HETERO_TRAIN};
  if (std::find(extra.begin(), extra.end(), "--augment") == extra.end()) {
    argv.insert(argv.end(), {"--augment", "light"});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The training samples of a job that must outlast a membership change (a late start, a new
// member, a replaced process): all 60,000 in the plain build, where 5 epochs take about 20 s; a
// third under ASan, where the CPU trainer is about 6x slower (2,400 samples/s alone here) and 5
// full epochs outlasted ctest's 300 s on a CI machine with another test beside them. The change
// still lands inside the job: 5 epochs of 20,000 take about 45 s alone under ASan.
inline uint64_t longJobSamples() {
#if defined(__SANITIZE_ADDRESS__)
  WARN("under ASan: 20,000 training samples an epoch, not 60,000 (the trainer's speed)");
  return 20000;
#else
  return 60000;
#endif
}

// A path of this test process's own under /tmp.
inline std::string tempPath(const std::string& name) {
  return "/tmp/troupe-train-test-" + std::to_string(getpid()) + "-" + name;
}

// Exactly-once (docs/hetero_train.md): the report has `epochs` epochs, and each delivered every one
// of `samples` samples once: no duplicate, none missing, and the epoch's digest that of ids 0 ..
// samples - 1 once each, computed here (the counters are the trainer's own). For a resumed job
// they include what the interrupted run trained on (carried in the checkpoint, sample by sample),
// so this checks the promise across both runs. Returns the report and removes its file.
inline nlohmann::json checkEverySampleOnce(const std::string& report, size_t epochs,
                                           uint64_t samples) {
  std::ifstream in(report);
  REQUIRE(in.good());
  auto j = nlohmann::json::parse(in);
  REQUIRE(j["epochs"].size() == epochs);
  for (auto& e : j["epochs"]) {
    INFO("epoch " << e["epoch"]);
    CHECK(e["samples"] == samples);
    CHECK(e["duplicates"] == 0);
    CHECK(e["missing"] == 0);
    CHECK(e["digest"] == test_digest::everyIdOnce(samples));
  }
  CHECK(j["exit_status"] == 0);
  unlink(report.c_str());
  return j;
}

// Waits until `run` has trained past the first step of epoch 1 of `epochs` (a progress line
// "epoch 1/E, step N/T" with N > 0): where a fault "in training" lands, as the fault matrix's
// moments do (tests/faults). Not the first progress line: that one may say "step 0", before the
// trainer has handed out any shard (seen under ASan on a loaded CI machine), and a node lost then
// holds no stream to break.
inline void waitPastFirstStep(harness::Run& run, int epochs, std::chrono::milliseconds timeout) {
  std::regex pastFirst("progress: epoch 1/" + std::to_string(epochs) + ", step [1-9][0-9]*/");
  if (!run.waitFor(pastFirst, timeout)) {
    FAIL("no progress line of epoch 1 past step 0; output:\n" << run.output());
  }
}

// The test accuracy after the last epoch.
inline double finalAccuracy(const nlohmann::json& report) {
  return report["epochs"].back()["test_accuracy"].get<double>();
}

}  // namespace train_job
