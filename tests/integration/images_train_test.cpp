// hetero_train on the user's own images (docs/data.md): an ImageFolder of JPEGs and PNGs of many
// sizes made here from Fashion-MNIST (make_images), the same as WebDataset shards and as a CSV
// manifest; a data instance killed and one drained mid-epoch; a corrupt JPEG that fails the job
// naming it, or is skipped and listed; a dataset or a transform that cannot be used, refused at
// start. Every sample once is judged by the report's digest, computed here.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include <kj/common.h>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;
namespace fs = std::filesystem;

namespace {

// A small transform (32x32 output): these tests judge the data plane, not the model's cost.
const std::string kTransform =
    "RandomResizedCrop(32,scale=(0.5,1.0)),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),"
    "Normalize(imagenet)";

// make_images into a folder of this test's; `extra` its flags. Returns the folder (train/, test/,
// train.csv) and make_images' output (the corrupt files' lines).
struct Made {
  std::string dir, output;
};
Made makeImages(const std::string& name, std::vector<std::string> extra) {
  auto dir = tempPath(name);
  fs::remove_all(dir);
  std::vector<std::string> argv = {MAKE_IMAGES, dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Run run(argv);
  int code = run.wait(120s);
  INFO(run.output());
  REQUIRE(code == 0);
  return {dir, run.output()};
}

// The training images of a job a fault lands inside: 6,000; 2,000 under ASan, where decoding and
// the CPU trainer are several times slower and two faulted runs of 6,000 outlast ctest's timeout.
unsigned faultSamples() {
#if defined(__SANITIZE_ADDRESS__)
  WARN("under ASan: 2,000 training images, not 6,000 (the decoder's and trainer's speed)");
  return 2000;
#else
  return 6000;
#endif
}

std::vector<std::string> train(const std::string& dataset, std::vector<std::string> extra) {
  std::vector<std::string> argv = {HETERO_TRAIN, "--dataset", dataset, "--transform", kTransform};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// One epoch on `dataset` without --skip-bad-samples, which must fail (exit 1, every process
// reaped): the head's output/failure, said in the test's messages.
std::string failedOn(const std::string& dataset) {
  auto cluster = kCluster;
  cluster.insert(cluster.begin(), "--keep");  // the roots stay, for output/failure
  Run run(harness::sim(cluster, train(dataset, {"--epochs", "1"})));
  int code = run.wait(120s);
  INFO(run.output());
  CHECK(code == 1);
  CHECK(run.leftovers().empty());
  auto roots = harness::rootsOf(run);
  REQUIRE(!roots.empty());
  KJ_DEFER(fs::remove_all(roots));
  auto failure = harness::readFile(roots + "/" + harness::headOf(roots) + "/output/failure");
  UNSCOPED_INFO("the head's output/failure: " << failure);
  return failure;
}

// The manifest's rows as WebDataset shards: each sample's image and its .cls under one basename,
// `shards` tar files written by tar(1) (what `tar -cf` of a WebDataset folder makes).
std::string makeShards(const std::string& dir, int shards) {
  auto stage = dir + "/stage", out = dir + "/shards";
  fs::create_directories(stage);
  fs::create_directories(out);
  std::ifstream csv(dir + "/train.csv");
  std::string line;
  std::getline(csv, line);  // the header
  std::vector<std::string> names;
  int i = 0;
  while (std::getline(csv, line)) {
    auto comma = line.rfind(',');
    REQUIRE(comma != std::string::npos);
    fs::path image = dir + "/" + line.substr(0, comma);
    char base[32];
    snprintf(base, sizeof(base), "%06d", i++);
    fs::copy_file(image, stage + "/" + base + image.extension().string());
    std::ofstream(stage + "/" + base + ".cls") << line.substr(comma + 1) << "\n";
    names.push_back(std::string(base) + image.extension().string());
    names.push_back(std::string(base) + ".cls");
  }
  size_t per = (names.size() / 2 + shards - 1) / shards * 2;
  for (int s = 0; s < shards; ++s) {
    auto list = dir + "/list-" + std::to_string(s);
    std::ofstream l(list);
    for (size_t k = s * per; k < std::min(names.size(), (s + 1) * per); ++k) l << names[k] << "\n";
    l.close();
    char tar[64];
    snprintf(tar, sizeof(tar), "/shard-%06d.tar", s);
    auto cmd = "tar -cf '" + out + tar + "' -C '" + stage + "' -T '" + list + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  return out;
}

nlohmann::json runToEnd(Run& run, const std::string& report, size_t epochs, uint64_t samples) {
  int code = run.wait(240s);
  INFO(run.output());
  REQUIRE(code == 0);
  CHECK(run.leftovers().empty());
  return train_job::checkEverySampleOnce(report, epochs, samples);
}

}  // namespace

TEST_CASE(
    "your images as an ImageFolder, WebDataset shards and a CSV manifest - each trains, "
    "every sample once",
    "[train][images]") {
  auto made = makeImages("imgs-kinds", {"--samples", "1200", "--test-samples", "300"});
  SECTION("ImageFolder, with a test set the model learns on") {
    auto report = tempPath("folder.json");
    Run run(harness::sim(
        kCluster, train(made.dir + "/train", {"--epochs", "3", "--test-dataset", made.dir + "/test",
                                              "--report", report})));
    auto j = runToEnd(run, report, 3, 1200);
    CHECK(j["dataset"]["kind"] == "ImageFolder");
    CHECK(j["dataset"]["classes"] == 10);
    CHECK(j["dataset"]["sample_shape"] == nlohmann::json::array({3, 32, 32}));
    CHECK(j["dataset"]["test_transform"].get<std::string>().rfind("Resize(36),CenterCrop(32)", 0) ==
          0);
    // Chance is 0.1: the pixels and the labels the trainer got belong together.
    CHECK(train_job::finalAccuracy(j) > 0.4);
    CHECK(j["skipped_files"].empty());
    // Cut as torch's DataLoader cuts an epoch: 9 whole batches of 128 and one of 48, each epoch.
    CHECK(j["trainer_cpu"]["batches"] == 3 * 10);
  }
  SECTION("WebDataset shards") {
    auto shards = makeShards(made.dir, 3);
    auto report = tempPath("shards.json");
    Run run(harness::sim(kCluster, train(shards, {"--epochs", "2", "--drop-last", "--report",
                                                  report})));
    int code = run.wait(240s);
    INFO(run.output());
    REQUIRE(code == 0);
    CHECK(run.leftovers().empty());
    std::ifstream in(report);
    REQUIRE(in.good());
    auto j = nlohmann::json::parse(in);
    CHECK(j["dataset"]["kind"] == "WebDataset");
    CHECK(j["dataset"]["classes"] == 10);
    // --drop-last: 9 whole batches of 128 an epoch (1,152 samples); the 48 left out are neither
    // trained nor missing.
    REQUIRE(j["epochs"].size() == 2);
    for (auto& e : j["epochs"]) {
      CHECK(e["samples"] == 1152);
      CHECK(e["missing"] == 0);
      CHECK(e["duplicates"] == 0);
    }
    CHECK(j["trainer_cpu"]["batches"] == 2 * 9);
    unlink(report.c_str());
  }
  SECTION("a CSV manifest") {
    auto report = tempPath("manifest.json");
    Run run(harness::sim(kCluster,
                         train(made.dir + "/train.csv", {"--epochs", "2", "--report", report})));
    auto j = runToEnd(run, report, 2, 1200);
    CHECK(j["dataset"]["kind"] == "manifest");
  }
  fs::remove_all(made.dir);
}

TEST_CASE(
    "your images: a data instance killed mid-epoch, and one drained by SIGTERM - every "
    "sample once",
    "[train][images][fault]") {
  auto samples = faultSamples();
  auto made =
      makeImages("imgs-faults", {"--samples", std::to_string(samples), "--test-samples", "0"});
  // 64x64 and 3 epochs: an epoch lasts seconds here, the fault lands inside epoch 1.
  auto transform = "RandomResizedCrop(64),RandomHorizontalFlip(),Normalize(imagenet)";
  for (int sig : {SIGKILL, SIGTERM}) {
    DYNAMIC_SECTION((sig == SIGKILL ? "SIGKILL" : "SIGTERM") << " to a data instance") {
      auto report = tempPath("fault.json");
      Run run(harness::sim(kCluster, {HETERO_TRAIN, "--dataset", made.dir + "/train", "--transform",
                                      transform, "--epochs", "3", "--augmenters-per-node", "2",
                                      "--progress-every", "0.2", "--report", report}));
      train_job::waitPastFirstStep(run, 3, 120s);
      auto victim = harness::instanceIn(run, "data_group");
      REQUIRE(kill(victim.pid, sig) == 0);
      int code = run.wait(240s);
      auto out = run.output();
      INFO(out);
      if (sig == SIGKILL) {
        CHECK(harness::headDoneHostKilled(code, out));
        CHECK(out.find("node " + victim.host + " (data_group) was lost") != std::string::npos);
      } else {
        CHECK(code == 0);  // a drained instance exits 0 (docs/lifecycle.md)
      }
      train_job::checkEverySampleOnce(report, 3, samples);
      CHECK(run.leftovers().empty());
    }
  }
  fs::remove_all(made.dir);
}

TEST_CASE(
    "a corrupt JPEG fails the job naming the file, or with --skip-bad-samples is skipped "
    "and listed",
    "[train][images][bad-input]") {
  auto made =
      makeImages("imgs-corrupt", {"--samples", "600", "--test-samples", "0", "--corrupt", "2"});
  std::smatch m;
  std::vector<std::string> corrupt;
  std::regex line("corrupt: (\\S+) cut");
  for (auto it = std::sregex_iterator(made.output.begin(), made.output.end(), line);
       it != std::sregex_iterator(); ++it) {
    corrupt.push_back((*it)[1]);
  }
  INFO(made.output);
  REQUIRE(corrupt.size() == 2);
  SECTION("without --skip-bad-samples: exit 1, the failure file names it") {
    auto failure = failedOn(made.dir + "/train");
    CHECK(failure.find("a training sample could not be read: ") != std::string::npos);
    bool named = false;
    for (auto& f : corrupt)
      named = named || failure.find(fs::path(f).filename()) != std::string::npos;
    CHECK(named);
    CHECK(failure.find("--skip-bad-samples") != std::string::npos);
  }
  SECTION("with --skip-bad-samples: trains on, both files listed, counted as skipped") {
    auto report = tempPath("skip.json");
    Run run(harness::sim(
        kCluster,
        train(made.dir + "/train", {"--epochs", "2", "--skip-bad-samples", "--report", report})));
    int code = run.wait(120s);
    INFO(run.output());
    REQUIRE(code == 0);
    std::ifstream in(report);
    REQUIRE(in.good());
    auto j = nlohmann::json::parse(in);
    REQUIRE(j["epochs"].size() == 2);
    for (auto& e : j["epochs"]) {
      CHECK(e["samples"] == 598);
      CHECK(e["skipped"] == 2);
      CHECK(e["missing"] == 0);
      CHECK(e["duplicates"] == 0);
    }
    auto files = j["skipped_files"].dump();
    CHECK(j["skipped_files"].size() == 2);
    for (auto& f : corrupt) CHECK(files.find(fs::path(f).filename()) != std::string::npos);
    unlink(report.c_str());
  }
  fs::remove_all(made.dir);
}

// What a real collection holds (make_images --hostile): a README.txt and a Thumbs.db in class
// folders, a JPEG with stray bytes before its end marker, and a 3 KB progressive JPEG whose
// header claims 65000 x 65000 pixels. Before: the bomb grew the data process to 8 GB, then the
// dnn host's, and the job ended 137 naming nothing. The memory is read from the OS: the largest
// resident set of every process the run started and reaped (RUSAGE_CHILDREN).
TEST_CASE(
    "a collection with a README, a Thumbs.db, a stray-bytes JPEG and a bomb trains with "
    "--skip-bad-samples under 1 GB",
    "[train][images][bad-input]") {
  auto made = makeImages("imgs-hostile", {"--samples", "600", "--test-samples", "0", "--hostile"});
  INFO(made.output);
  std::smatch m;
  REQUIRE(
      std::regex_search(made.output, m, std::regex("hostile: (\\S+): a \\d+-byte progressive")));
  auto bomb = fs::path(m[1].str()).filename().string();
  REQUIRE(std::regex_search(made.output, m, std::regex("hostile: (\\S+): 8 stray bytes")));
  auto stray = fs::path(m[1].str()).filename().string();
  SECTION("without --skip-bad-samples: exit 1, the failure file names the bomb and its size") {
    auto failure = failedOn(made.dir + "/train");
    CHECK(failure.find(bomb) != std::string::npos);
    CHECK(failure.find("65000 x 65000") != std::string::npos);
  }
  SECTION("with --skip-bad-samples: the bomb skipped, the rest trained, no process above 1 GB") {
    auto report = tempPath("hostile.json");
    Run run(harness::sim(
        kCluster,
        train(made.dir + "/train", {"--epochs", "2", "--skip-bad-samples", "--report", report})));
    int code = run.wait(180s);
    auto out = run.output();
    INFO(out);
    REQUIRE(code == 0);
    CHECK(out.find("left out 2 file(s) that are not images") != std::string::npos);
    std::ifstream in(report);
    REQUIRE(in.good());
    auto j = nlohmann::json::parse(in);
    REQUIRE(j["epochs"].size() == 2);
    for (auto& e : j["epochs"]) {
      CHECK(e["samples"] == 599);  // the stray-bytes JPEG among them, as PIL decodes it
      CHECK(e["skipped"] == 1);
      CHECK(e["missing"] == 0);
      CHECK(e["duplicates"] == 0);
    }
    auto files = j["skipped_files"].dump();
    CHECK(j["skipped_files"].size() == 1);
    CHECK(files.find(bomb) != std::string::npos);
    CHECK(files.find(stray) == std::string::npos);
    // Decoded as PIL decodes it, and counted: the report lists it with libjpeg's warning.
    REQUIRE(j["warned_files"].size() == 1);
    CHECK(j["warned_files"][0].get<std::string>().find(stray + ": Corrupt JPEG data: ") !=
          std::string::npos);
    CHECK(j["warned_files"][0].get<std::string>().find(" extraneous bytes before marker 0xd9") !=
          std::string::npos);
    CHECK(out.find("decoded despite libjpeg's warning, as PIL decodes it: ") != std::string::npos);
    struct rusage children {};
    REQUIRE(getrusage(RUSAGE_CHILDREN, &children) == 0);
    INFO("the largest process the run reaped: " << children.ru_maxrss / 1024 << " MiB");
    CHECK(children.ru_maxrss > 0);
    CHECK(children.ru_maxrss < 1024 * 1024);  // KiB
    unlink(report.c_str());
    CHECK(run.leftovers().empty());
  }
  fs::remove_all(made.dir);
}

TEST_CASE("a dataset or transform that cannot be used is refused at start, exit 2, naming it",
          "[train][images][bad-input]") {
  auto made = makeImages("imgs-bad", {"--samples", "100", "--test-samples", "0"});
  auto refused = [](std::vector<std::string> argv, const std::string& says) {
    Run run(harness::sim(kCluster, argv));
    int code = run.wait(60s);
    INFO(run.output());
    CHECK(code == 2);
    CHECK(run.output().find(says) != std::string::npos);
    CHECK(run.leftovers().empty());
  };
  SECTION("a misspelt transform") {
    refused({HETERO_TRAIN, "--dataset", made.dir + "/train", "--transform",
             "RandomResizedCrop(32),RandomHorizontalFlp()"},
            "RandomHorizontalFlip");
  }
  SECTION("an empty class folder") {
    fs::create_directories(made.dir + "/train/99_empty");
    refused(train(made.dir + "/train", {}), "99_empty");
    fs::remove(made.dir + "/train/99_empty");
  }
  SECTION("a manifest label out of range") {
    auto csv = made.dir + "/bad.csv";
    std::ofstream(csv) << "path,label\ntrain/0_tshirt_top/000001.jpg,-3\n";
    refused(train(csv, {}), "bad.csv");
  }
  SECTION("a path that holds no dataset") {
    fs::create_directories(made.dir + "/nothing");
    refused(train(made.dir + "/nothing", {}), made.dir + "/nothing");
  }
  SECTION("a test transform whose output is not the training one's") {
    refused(train(made.dir + "/train", {"--test-dataset", made.dir + "/train", "--test-transform",
                                        "Resize(40),CenterCrop(40),Normalize(imagenet)"}),
            "--test-transform writes 4800");
  }
  fs::remove_all(made.dir);
}

TEST_CASE(
    "your images: interrupted as a spot reclaim mid-epoch and started again from the "
    "checkpoint - every sample once across both runs",
    "[train][images][resume]") {
  auto samples = faultSamples();
  auto made =
      makeImages("imgs-resume", {"--samples", std::to_string(samples), "--test-samples", "0"});
  auto checkpoints = tempPath("imgs-checkpoints");
  fs::remove_all(checkpoints);
  auto report = tempPath("imgs-resumed.json");
  auto* fixed = getenv("TROUPE_TEST_SEED");
  unsigned seed = fixed && *fixed ? unsigned(std::stoul(fixed)) : std::random_device()();
  WARN("interrupt seed " << seed << " (TROUPE_TEST_SEED=" << seed << " replays it)");
  // At least 100 ms into epoch 2: under ASan and a loaded machine an interruption 58 ms after its
  // first progress line came before its first step (resumed from sample 0: no mid-epoch resume).
  Run run(harness::sim(
      {"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
       "--checkpoints", checkpoints, "--interrupt-random-ms", "100:350", "--interrupt-when",
       "progress: epoch 2/3", "--interrupt-seed", std::to_string(seed), "--restarts-on-interrupt",
       "1", "--hp", "checkpoint_every=10"},
      {HETERO_TRAIN, "--dataset", made.dir + "/train", "--transform",
       "RandomResizedCrop(64),RandomHorizontalFlip(),Normalize(imagenet)", "--epochs", "3",
       "--augmenters-per-node", "1", "--progress-every", "0.2", "--report", report}));
  int code = run.wait(240s);
  auto out = run.output();
  INFO(out);
  REQUIRE(out.find("troupe sim: interrupting the job as a spot reclaim does") != std::string::npos);
  CHECK(out.find("run 1 ended with 6 (INTERRUPTED) after the interruption") != std::string::npos);
  CHECK(code == 0);
  auto j = train_job::checkEverySampleOnce(report, 3, samples);
  REQUIRE(j["resumed_from"].is_object());
  auto epoch = j["resumed_from"]["epoch"].get<int>();
  auto carried = j["epochs"][epoch - 1]["from_checkpoint"].get<uint64_t>();
  INFO("resumed epoch " << epoch << " from sample " << carried);
  CHECK(carried > 0);
  CHECK(carried < samples);
  CHECK(run.leftovers().empty());
  fs::remove_all(checkpoints);
  fs::remove_all(made.dir);
}
