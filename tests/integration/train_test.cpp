// hetero_train on a simulated heterogeneous cluster: a data instance dies mid-epoch and every
// sample still arrives exactly once; the trainer's instance dies and everything exits non-zero,
// naming the trainer; bad settings are refused before any work starts.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <regex>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;
using train_job::train;

namespace {

// Kills the first data instance once training is under way: after the first step of the first
// epoch (progress lines every 0.2 s come well before an epoch of 12,000 samples ends). Returns the
// victim's host.
std::string killDataInstanceInEpoch1(Run& run) {
  train_job::waitPastFirstStep(run, 2, 60s);
  auto victim = harness::instanceIn(run, "data_group");
  REQUIRE(kill(victim.pid, SIGKILL) == 0);
  return victim.host;
}

// Exactly-once (docs/hetero_train.md): both epochs of the report have every sample once.
void checkEverySampleOnce(const std::string& report) {
  train_job::checkEverySampleOnce(report, 2, 12000);
}

}  // namespace

TEST_CASE("batches from the data instances are trained on where they were received",
          "[train][data-plane]") {
  auto report = tempPath("zero-copy.json");
  Run run(harness::sim(kCluster, train({"--epochs", "1", "--train-samples", "6000",
                                        "--augmenters-per-node", "1", "--report", report})));
  int code = run.wait(180s);
  INFO(run.output());
  REQUIRE(code == 0);
  auto j = train_job::checkEverySampleOnce(report, 1, 6000);
  auto cpu = j["trainer_cpu"];
  INFO(cpu.dump());
  // Promise (issue 11, docs/benchmarks.md "Streaming batches"): the trainer steps straight from
  // the received message; no batch from another instance is copied on arrival.
  CHECK(cpu["batches"].get<uint64_t>() >= 6000 / 128);  // two shards of 3,000: 48
  CHECK(cpu["copied_batches"] == 0);
  CHECK(cpu["receive_ms_per_batch"].get<double>() > 0);
}

TEST_CASE("a data instance killed mid-epoch: the job completes, every sample exactly once",
          "[train][fault]") {
  auto report = tempPath("report.json");
  Run run(harness::sim(
      kCluster, train({"--epochs", "2", "--train-samples", "12000", "--augmenters-per-node", "2",
                       "--progress-every", "0.2", "--report", report})));
  auto victim = killDataInstanceInEpoch1(run);
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  // docs/exit-codes.md: the job completed on its head, every other instance ended it normally,
  // and the killed one (not started again here) reports SIGKILL on its line, which makes troupe
  // sim's status, judged as SageMaker judges a job, 137.
  CHECK(harness::headDoneHostKilled(code, out));
  for (auto& [host, i] : run.instances()) {
    auto line = run.exitLine(host);
    if (host == victim) {
      CHECK(line.find("exited with 137") != std::string::npos);
    } else {
      CHECK(line.empty());  // exited 0
    }
  }
  CHECK(out.find("node " + victim + " (data_group) was lost") != std::string::npos);
  CHECK(out.find("restarting 'augmenter-") != std::string::npos);
  checkEverySampleOnce(report);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a data instance killed where no vCPU is spare: the survivors take its shards",
          "[train][fault]") {
  // ml.g5.xlarge has 4 vCPUs: the trainer takes one and hetero_train's default one augmenter per
  // vCPU fills the rest, so the lost node's 4 augmenters find room for 3 at most.
  auto report = tempPath("nospare.json");
  Run run(
      harness::sim({"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.g5.xlarge"},
                   train({"--epochs", "2", "--train-samples", "12000", "--progress-every", "0.2",
                          "--report", report})));
  killDataInstanceInEpoch1(run);
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  // docs/lifecycle.md: lost capacity degrades, never fails the head's job.
  CHECK(harness::headDoneHostKilled(code, out));
  CHECK(out.find("could not restart it: ") != std::string::npos);
  CHECK(out.find("will not come back") != std::string::npos);
  CHECK(out.find("the others take its shards") != std::string::npos);
  // A shard the lost node was streaming goes back to the queue ("the shard goes back to the queue
  // from sample"); under the trainer's memory budget (issue 61) the node may have had none in
  // flight at the kill (1 run in 4 here, idle or loaded), so that line is not required: every
  // sample trained once is.
  checkEverySampleOnce(report);
  CHECK(run.leftovers().empty());
}

TEST_CASE("the trainer's instance killed: every process exits non-zero, naming the trainer",
          "[train][fault]") {
  Run run(
      harness::sim({"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
                    "--env", "data_group:TROUPE_HEAD_TIMEOUT_MS=3000"},
                   train({"--epochs", "3", "--train-samples", "12000", "--augmenters-per-node", "1",
                          "--progress-every", "0.2"})));
  REQUIRE_OUTPUT(run, "progress: epoch 1/3, step ", 60s);
  std::string trainerHost;
  for (auto& [host, i] : run.instances()) {
    if (i.group == "dnn_group") {
      trainerHost = host;
      REQUIRE(kill(i.pid, SIGKILL) == 0);
    }
  }
  auto killedAt = std::chrono::steady_clock::now();
  REQUIRE(run.wait(30s) != 0);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - killedAt);
  auto out = run.output();
  INFO(out);
  WARN("every process had exited " << took.count() << " ms after the trainer's instance died");
  CHECK(took < 3000ms + 4000ms);  // the head timeout, plus slack for a loaded CI machine
  for (auto& [host, i] : run.instances()) {
    CHECK(run.exitLine(host).find("exited with") != std::string::npos);
  }
  CHECK(out.find("lost the head " + trainerHost) != std::string::npos);
  CHECK(out.find("and with it 'trainer' (train.Trainer") != std::string::npos);
  CHECK(run.leftovers().empty());
}

namespace {

// fault_app's malformed batches, `each` in front of the second batch of each shard it serves in
// epoch 1 (4096 samples in shards of 8 batches of 64 are 8 shards), are rejected in epoch 1, none
// in epoch 2: counted per epoch, so a run that lost some of one epoch's and rejected more in
// another fails. Any other rejection is a real stream's batch that came after its shard moved (a
// straggler's shard taken over on a busy machine), logged as such with the epoch the trainer was
// in.
void rejectedInEpochOne(const std::string& out, int each) {
  std::map<int, int> late;
  std::regex stale(R"(rejected a batch of shard [0-9]+ from stream ([0-9]+) .*, epoch ([0-9]+)\))");
  for (std::sregex_iterator it(out.begin(), out.end(), stale), end; it != end; ++it) {
    // fault_app's stale batches claim streams 1001-1008.
    if (std::stoi((*it)[1]) < 1000) ++late[std::stoi((*it)[2])];
  }
  for (int epoch : {1, 2}) {
    INFO("epoch " << epoch);
    std::smatch m;
    std::regex result("RESULT epoch " + std::to_string(epoch) +
                      ": samples 4096, duplicates 0, missing 0, rejected ([0-9]+)");
    REQUIRE(std::regex_search(out, m, result));
    if (late[epoch] > 0) {
      WARN(late[epoch] << " batch(es) of a taken-over shard came late and were rejected");
    }
    CHECK(std::stoi(m[1]) == (epoch == 1 ? 8 * each : 0) + late[epoch]);
  }
}

}  // namespace

TEST_CASE("malformed batches are rejected with the reason, and lose no sample",
          "[train][bad-input]") {
  // Five malformed batches a shard: wrong ids, a float short, no such shard, one sample too many,
  // another session's.
  Run run(harness::sim(kCluster, {FAULT_APP}));
  REQUIRE(run.wait(120s) == 0);
  auto out = run.output();
  INFO(out);
  rejectedInEpochOne(out, 5);
  for (auto shard : {"0", "1"}) {
    auto at = std::string("rejected a batch of shard ") + shard + " at position 64: ";
    CHECK(out.find(at + "sample ids at position 64 are not the shard's") != std::string::npos);
    CHECK(out.find(at + "shape mismatch: 64 ids, 64 labels, 50175 floats") != std::string::npos);
    CHECK(out.find(at + "a batch of 65 samples (batch size 64)") != std::string::npos);
  }
  CHECK(out.find("rejected a batch from unknown shard 99") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE(
    "a script's batch whose tensor lies about its bytes is rejected naming it, and the "
    "script gets every sample once, each tensor as made",
    "[train][bad-input]") {
  // fault_app --tensors: a training script's batches (troupe.data's), a row of 784 float32 and an
  // int64 target a sample, each its id; the script's side (a thread of the head's process, as the
  // Python package's) checks every tensor and value it is handed, and counts the samples itself.
  // Four malformed tensors a shard: an object dtype, 1000 rows more than the bytes, a tensor past
  // the batch's bytes, negative dimensions whose product fits.
  Run run(harness::sim(kCluster, {FAULT_APP, "--tensors"}));
  REQUIRE(run.wait(120s) == 0);
  auto out = run.output();
  INFO(out);
  rejectedInEpochOne(out, 4);
  for (int epoch : {1, 2}) {
    CHECK(out.find("SCRIPT epoch " + std::to_string(epoch) +
                   ": samples 4096, each once 4096, batches not as made 0") != std::string::npos);
  }
  CHECK(out.find("SCRIPT ended: finished") != std::string::npos);
  for (auto shard : {"0", "1"}) {
    auto at = std::string("rejected a batch of shard ") + shard + " at position 64: a tensor ";
    CHECK(out.find(at + "of dtype '|O' and shape (64, 784) is not its 200704 bytes") !=
          std::string::npos);
    CHECK(out.find(at + "of dtype '<f4' and shape (1064, 784) is not its 200704 bytes") !=
          std::string::npos);
    CHECK(out.find(at + "of dtype '<f4' and shape (-64, -784) is not its 200704 bytes") !=
          std::string::npos);
    CHECK(out.find(at + "of 512 bytes at 200712 beyond the batch's 201216") != std::string::npos);
  }
  CHECK(run.leftovers().empty());
}

TEST_CASE("bad settings are refused before any work starts", "[train][bad-input]") {
  SECTION("batch size 0") {
    Run run(harness::sim(kCluster, train({"--batch-size", "0"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--batch-size: Value 0 not in range") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("a negative learning rate") {
    Run run(harness::sim(kCluster, train({"--lr", "-0.1"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--lr") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("an even blur kernel") {
    Run run(harness::sim(kCluster, train({"--blur", "4"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("blurKernel") != std::string::npos);
  }
  SECTION("spot pricing without a price file") {
    Run run(harness::sim(kCluster, train({"--pricing", "spot"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--pricing spot needs --prices FILE") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("a price file that is not one") {
    auto prices = tempPath("bad-prices.csv");
    std::ofstream(prices) << "type,price\nml.c5.xlarge,0.2\n";
    Run run(harness::sim(kCluster, train({"--prices", prices})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--prices: price file '" + prices +
                            "' line 1: the header needs instance_type") != std::string::npos);
    CHECK(run.leftovers().empty());
    unlink(prices.c_str());
  }
  SECTION("a missing dataset") {
    Run run(harness::sim(kCluster, train({"--data-dir", "/nonexistent/fashion"})));
    REQUIRE(run.wait(60s) == 1);
    CHECK(run.output().find("/nonexistent/fashion") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
}
