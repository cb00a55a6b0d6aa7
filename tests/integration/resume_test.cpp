// hetero_train interrupted and started again, as SageMaker does with managed spot training: the
// resumed job trains every sample of every epoch exactly once counting both runs and ends where
// an uninterrupted job of the same seed ends; a process killed inside a checkpoint write leaves
// the previous checkpoint to resume from; a checkpoint of another job, or a damaged one, is
// refused before anything starts.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;
using train_job::train;
namespace fs = std::filesystem;

namespace {

// A folder removed when the test ends.
struct Folder {
  fs::path path;
  explicit Folder(const std::string& name) : path(tempPath(name)) { fs::remove_all(path); }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The interruption's seed: TROUPE_TEST_SEED to replay a failure, else a fresh one. Printed.
unsigned interruptSeed() {
  auto* fixed = getenv("TROUPE_TEST_SEED");
  unsigned seed = fixed && *fixed ? unsigned(std::stoul(fixed)) : std::random_device()();
  WARN("interrupt seed " << seed << " (TROUPE_TEST_SEED=" << seed << " replays it)");
  return seed;
}

std::vector<std::string> files(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

const std::vector<std::string> kJob = {
    "--epochs",         "3",  "--train-samples", "12000", "--augmenters-per-node", "1",
    "--progress-every", "0.2"};

std::vector<std::string> job(std::vector<std::string> extra) {
  auto args = kJob;
  args.insert(args.end(), extra.begin(), extra.end());
  return train(args);
}

}  // namespace

TEST_CASE(
    "interrupted mid-epoch at a random moment and started again: every sample once, the "
    "accuracy of an uninterrupted run",
    "[train][resume]") {
  // The reference: the same seed (hetero_train's default, 42), never interrupted.
  auto reference = tempPath("reference.json");
  {
    Run run(harness::sim(kCluster, job({"--report", reference})));
    REQUIRE(run.wait(120s) == 0);
    CHECK(run.leftovers().empty());
  }
  auto uninterrupted = train_job::checkEverySampleOnce(reference, 3, 12000);

  // SageMaker's cycle in one command: a SIGTERM to every instance at a random moment of epoch 2,
  // then the job again on new instances with the checkpoint folder synced back. As on SageMaker,
  // hetero_train finds the folder in its root and the interval in its hyperparameters.
  Folder checkpoints("checkpoints");
  auto report = tempPath("resumed.json");
  auto seed = interruptSeed();
  Run run(harness::sim(
      {"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
       "--checkpoints", checkpoints.path.string(), "--interrupt-random-ms", "0:250",
       "--interrupt-when", "progress: epoch 2/3", "--interrupt-seed", std::to_string(seed),
       "--restarts-on-interrupt", "1", "--hp", "checkpoint_every=25"},
      job({"--report", report})));
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  // docs/exit-codes.md: the interrupted run exits 6 (INTERRUPTED) on every instance; the job
  // started again completes and the simulator exits with its 0.
  REQUIRE(out.find("troupe sim: interrupting the job as a spot reclaim does") != std::string::npos);
  CHECK(out.find("run 1 ended with 6 (INTERRUPTED) after the interruption") != std::string::npos);
  CHECK(code == 0);

  // SIGTERM made the trainer write a checkpoint within the grace period, and the second run
  // resumed from exactly that one.
  std::smatch stop;
  REQUIRE(std::regex_search(
      out, stop,
      std::regex(R"((checkpoint-\d+\.troupe) written \(on stop, before training ended\))")));
  std::smatch resumed;
  REQUIRE(std::regex_search(
      out, resumed, std::regex(R"(resumed from checkpoint \S+/(checkpoint-\d+\.troupe) )")));
  CHECK(resumed[1] == stop[1]);

  // Exactly once across both runs: every epoch's counts include the interrupted run's samples, and
  // the interruption was mid-epoch (the resumed epoch had samples from both runs).
  auto j = train_job::checkEverySampleOnce(report, 3, 12000);
  REQUIRE(j["resumed_from"].is_object());
  auto epoch = j["resumed_from"]["epoch"].get<int>();
  auto carried = j["epochs"][epoch - 1]["from_checkpoint"].get<uint64_t>();
  INFO("resumed epoch " << epoch << " from sample " << carried);
  CHECK(carried > 0);
  CHECK(carried < 12000);
  CHECK(j["resumed_from"]["samples_of_epoch"] == carried);

  // Same model at the end: within 0.01 of the uninterrupted run (the order batches arrive in
  // differs between any two runs, interrupted or not).
  double a = train_job::finalAccuracy(j), b = train_job::finalAccuracy(uninterrupted);
  WARN("test accuracy: " << a << " resumed, " << b << " uninterrupted");
  CHECK(std::fabs(a - b) <= 0.01);
  CHECK(run.leftovers().empty());
}

TEST_CASE(
    "SIGTERM reaching a worker before the head: the head's own SIGTERM is its first, and the "
    "trainer still writes its checkpoint",
    "[train][resume]") {
  // SageMaker stops every instance at once; a worker's request to leave can reach the head before
  // the head's own SIGTERM does. Within the drain window (docs/lifecycle.md) that SIGTERM is then
  // the head's first, a stop of the whole job, not a second one and not a drain.
  Folder checkpoints("sigterm-order");
  auto report = tempPath("stopped.json");
  Run run(harness::sim({"--group", "data_group=2:ml.c5.xlarge", "--group",
                        "dnn_group=1:ml.p3.2xlarge", "--checkpoints", checkpoints.path.string()},
                       job({"--report", report})));
  REQUIRE_OUTPUT(run, "progress: epoch 2/3", 90s);
  pid_t head = 0, worker = 0;
  for (auto& [host, i] : run.instances()) {
    if (i.group == "dnn_group") {
      head = i.pid;
    } else if (worker == 0) {
      worker = i.pid;
    }
  }
  REQUIRE(kill(worker, SIGTERM) == 0);
  REQUIRE_OUTPUT(run, "asks to leave; it is drained in", 20s);
  kill(head, SIGTERM);
  int code = run.wait(60s);
  auto out = run.output();
  INFO(out);
  // docs/exit-codes.md: only a second signal to the same process cuts the cascade short.
  CHECK(out.find("second SIGTERM") == std::string::npos);
  // docs/lifecycle.md: the trainer writes its checkpoint in the cascade of an early end.
  std::smatch stop;
  CHECK(std::regex_search(
      out, stop, std::regex(R"((checkpoint-\d+)\.troupe written \(on stop, before training ended\))")));
  CHECK(code == 6);  // INTERRUPTED
  CHECK(out.find("job failed (INTERRUPTED): SIGTERM on") != std::string::npos);
  CHECK(out.find("): drained") == std::string::npos);  // no drain: a stop of the whole job
  CHECK(run.leftovers().empty());

  // docs/hetero_train.md, "Reports": a stopped job's report says what it trained. The first
  // epoch is whole in the checkpoint written as it stopped (every sample once, by its digest),
  // the second is where it stopped, and the trainer's last progress is at most that far.
  REQUIRE(stop.size() == 2);
  std::ifstream in(report);
  REQUIRE(in.good());
  auto j = nlohmann::json::parse(in);
  INFO(j.dump(2));
  CHECK(j["exit_status"] == 6);
  CHECK(j["exit_code_name"] == "INTERRUPTED");
  CHECK(j["finished"] == false);
  CHECK(j["reason"].get<std::string>().find("SIGTERM on") == 0);
  REQUIRE(j["checkpoint"].is_object());
  CHECK(fs::path(j["checkpoint"]["path"].get<std::string>()).filename() ==
        stop[1].str() + ".troupe");
  CHECK(j["checkpoint"]["epoch"] == 2);
  uint64_t checkpointStep = j["checkpoint"]["step"];
  CHECK(stop[1].str() == "checkpoint-" + std::string(10 - std::to_string(checkpointStep).size(),
                                                     '0') + std::to_string(checkpointStep));
  REQUIRE(j["epochs"].size() == 1);
  CHECK(j["epochs"][0]["samples"] == 12000);
  CHECK(j["epochs"][0]["digest"] == test_digest::everyIdOnce(12000));
  REQUIRE(j["progress"].is_object());
  CHECK(j["progress"]["epoch"] == 2);
  CHECK(j["progress"]["step"].get<uint64_t>() > 0);
  CHECK(j["progress"]["step"].get<uint64_t>() <= checkpointStep);
  CHECK(j["instances"].size() == 3);
  CHECK(j["placements"].size() == 3);  // the trainer and one augmenter per data instance
  CHECK(out.find("the job ended before its report (INTERRUPTED): trained to epoch 2/3") !=
        std::string::npos);
  unlink(report.c_str());
}

TEST_CASE(
    "a process killed inside a checkpoint write: the previous checkpoint resumes, every "
    "sample once",
    "[train][resume]") {
  Folder checkpoints("killed-write");
  auto report = tempPath("after-kill.json");
  auto sim = [&](std::vector<std::string> extra) {
    return harness::sim({"--group", "data_group=2:ml.c5.xlarge", "--group",
                         "dnn_group=1:ml.p3.2xlarge", "--checkpoints", checkpoints.path.string(),
                         "--env", "data_group:TROUPE_HEAD_TIMEOUT_MS=2000"},
                        train(extra));
  };
  // Priced at spot rates from a price file (deploy/advise/prices.h).
  auto prices = tempPath("prices.csv");
  std::ofstream(prices) << "# test prices\ninstance_type,on_demand_usd_per_hour,spot_usd_per_hour\n"
                           "ml.c5.xlarge,0.204,0.07\nml.p3.2xlarge,3.825,1.2\n";
  const std::vector<std::string> settings = {"--epochs",
                                             "2",
                                             "--train-samples",
                                             "12000",
                                             "--augmenters-per-node",
                                             "1",
                                             "--checkpoint-every",
                                             "20",
                                             "--report",
                                             report,
                                             "--prices",
                                             prices,
                                             "--pricing",
                                             "spot"};
  {
    // The trainer's process SIGKILLs itself in its third write, between the temporary file and
    // the rename: the worst moment to die.
    auto args = settings;
    args.insert(args.end(), {"--test-kill-during-checkpoint", "3"});
    Run run(sim(args));
    int code = run.wait(120s);
    auto out = run.output();
    INFO(out);
    REQUIRE(out.find("test hook: killing this process during checkpoint write 3") !=
            std::string::npos);
    CHECK(code == 137);  // docs/exit-codes.md: the head killed by a signal, 128 + 9
    // The previous checkpoints are whole and the new one never got its name.
    CHECK(files(checkpoints.path) == std::vector<std::string>{".checkpoint-0000000060.troupe.tmp",
                                                              "checkpoint-0000000020.troupe",
                                                              "checkpoint-0000000040.troupe"});
    CHECK_FALSE(fs::exists(report));
    CHECK(run.leftovers().empty());
  }
  Run run(sim(settings));
  int code = run.wait(120s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  CHECK(std::regex_search(
      out, std::regex(R"(resumed from checkpoint \S+/checkpoint-0000000040\.troupe )")));
  auto j = train_job::checkEverySampleOnce(report, 2, 12000);
  CHECK(j["resumed_from"]["step"] == 40);
  // Step 40 of epoch 1: what the killed run trained on came from the checkpoint, 40 batches of at
  // most 128 samples (a shard's last batch is smaller: 1000-sample shards, docs/hetero_train.md).
  auto before = j["epochs"][0]["from_checkpoint"].get<uint64_t>();
  CHECK(before == j["resumed_from"]["samples_of_epoch"].get<uint64_t>());
  CHECK(before > 40 * 100);
  CHECK(before <= 40 * 128);
  CHECK_FALSE(fs::exists(checkpoints.path / ".checkpoint-0000000060.troupe.tmp"));
  CHECK(j["pricing"] == "spot");
  CHECK(j["cluster_price_per_hour_usd"].get<double>() == Approx(2 * 0.07 + 1.2));
  CHECK(run.leftovers().empty());
  unlink(prices.c_str());
}

TEST_CASE(
    "a checkpoint of another job or a damaged one is refused with exit 2, and --fresh sets "
    "it aside",
    "[train][resume]") {
  Folder checkpoints("refused");
  auto dir = checkpoints.path.string();
  // One node on its own (the dnn group is `local`): a short job that leaves checkpoints.
  auto alone = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        HETERO_TRAIN, "--dnn-group",      "local", "--epochs",
        "1",          "--train-samples",  "2400",  "--augmenters-per-node",
        "1",          "--checkpoint-dir", dir,     "--checkpoint-every",
        "5"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  {
    Run run(alone({}));
    REQUIRE(run.wait(120s) == 0);
  }
  auto written = files(checkpoints.path);
  REQUIRE(written.size() == 2);  // the newest two are kept
  auto newest = checkpoints.path / written[1];

  SECTION("another job's settings") {
    Run run(alone({"--batch-size", "64"}));
    // docs/exit-codes.md: a setting that cannot work is CONFIG_ERROR (2), before anything starts,
    // naming the file, what differs and what to do.
    CHECK(run.wait(30s) == 2);
    auto out = run.output();
    INFO(out);
    CHECK(out.find(newest.string() + " belongs to another job (batch size 128 in the checkpoint, "
                                     "64 in this job)") != std::string::npos);
    CHECK(out.find("start over with --fresh") != std::string::npos);
  }
  SECTION("a damaged file, then --fresh") {
    {
      std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(5000);
      f.put('\x7f');
    }
    Run run(alone({}));
    CHECK(run.wait(30s) == 2);
    auto out = run.output();
    INFO(out);
    CHECK(out.find(newest.string() + ": corrupt: checksum mismatch") != std::string::npos);
    CHECK(out.find("remove it to resume from the older intact checkpoint " + written[0]) !=
          std::string::npos);

    // Told to start over: the old checkpoints are set aside, not deleted, and the job completes.
    Run fresh(alone({"--fresh"}));
    CHECK(fresh.wait(120s) == 0);
    auto freshOut = fresh.output();
    INFO(freshOut);
    CHECK(freshOut.find("--fresh: the checkpoints of " + dir + " are set aside in ") !=
          std::string::npos);
    bool asideKept = false;
    for (auto& e : fs::directory_iterator(checkpoints.path)) {
      if (e.path().filename().string().rfind("discarded-", 0) == 0) {
        asideKept = fs::exists(e.path() / written[0]) && fs::exists(e.path() / written[1]);
      }
    }
    CHECK(asideKept);
  }
}
