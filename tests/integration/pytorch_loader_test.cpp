// troupe.data.DataLoader as torch's DataLoader (docs/pytorch.md, "The DataLoader"): its workers in
// parallel on each data instance, torch's randomness and beyond it (the same draws for a sample
// whichever worker, instance or run makes it), torch's arguments, several loaders in one script,
// the passes' reports and a DataLoader job's logs. tests/python/loader_check.py is the script;
// it prints what it saw, this file judges it. Skipped, with the reason on one line, where PyTorch
// is not installed for the Python the package was built for.
#include <catch2/catch.hpp>
#include <chrono>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "pytorch_test.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using train_job::kCluster;
using namespace pytorch_test;

namespace {

std::vector<std::string> loaderCheck(std::vector<std::string> args) {
  std::vector<std::string> argv = {PYTHON3, LOADER_CHECK};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// Every match of `pattern` in `out`, its first group each.
std::vector<std::string> all(const std::string& out, const std::string& pattern) {
  std::vector<std::string> found;
  std::regex re(pattern);
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

// loader_check.py random: each epoch's digest of every item's draws by its index.
std::vector<std::string> digests(const std::string& out) {
  return all(out, R"(check: epoch \d: 320 items, torch draws distinct \d+ of \d+, digest (\w+))");
}

// loader_check.py MODE... on make run's cluster: its exit code and output (every process it
// started checked gone).
std::pair<int, std::string> onCluster(std::vector<std::string> args,
                                      std::chrono::seconds timeout = 240s) {
  Run run(harness::sim(kCluster, loaderCheck(std::move(args))), pythonEnv());
  int code = run.wait(timeout);
  auto out = run.output();
  CHECK(run.leftovers().empty());
  return {code, out};
}

std::string children(int pid) {
  return harness::readFile("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                           "/children");
}

// make_images' ImageFolder of 300 samples in `dir`: its train folder.
std::string imageFolder(const troupe::testing::TempDir& dir) {
  Run made({MAKE_IMAGES, dir.path() + "/data", "--samples", "300", "--test-samples", "0"});
  REQUIRE(made.wait(60s) == 0);
  return dir.path() + "/data/train";
}

}  // namespace

TEST_CASE("troupe.data.DataLoader's workers run in parallel, num_workers on each data instance "
          "and none on the dnn instance, said in one line each",
          "[pytorch][loader]") {
  SKIP_WITHOUT_TORCH();
  Run run(harness::sim(kCluster, loaderCheck({"parallel", "2"})), pythonEnv());
  REQUIRE_OUTPUT(run, "check: epoch 0: 240 samples", 120s);
  // While the job runs: the dnn instance's process has one child, the fork server, which has
  // forked no worker (the data instances have room for every batch).
  auto dnn = harness::instanceIn(run, "dnn_group");
  std::istringstream server(children(dnn.pid));
  int forkServer = 0, other = 0;
  CHECK(bool(server >> forkServer));
  CHECK_FALSE(bool(server >> other));
  if (forkServer > 0) CHECK(children(forkServer).empty());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  for (int e : {0, 1}) {
    auto epoch = "check: epoch " + std::to_string(e);
    CHECK(out.find(epoch + ": 240 samples, 240 distinct") != std::string::npos);
    // Each data instance made items in 2 processes, which ran items at the same time.
    auto lines = all(out, epoch + R"(: instance (algo-\d): \d+ items from 2 worker processes, )"
                                  R"(at most [2-9] at once)");
    CHECK(lines.size() == 2);
    CHECK(all(out, epoch + R"(: instance (algo-\d): )").size() == 2);
    for (auto& host : lines) CHECK(host != dnn.host);
  }
  // One line per data instance says how many workers run, with their pids and CPUs; the
  // augmenters' and the trainer's starts are not said at info level.
  CHECK(all(out, R"(DataLoader 0 on (algo-\d): 2 worker processes \(pids \d+, \d+\) on CPUs )")
            .size() == 2);
  CHECK(out.find("DataLoader 0 on " + dnn.host + ":") == std::string::npos);
  CHECK(out.find("started 'augmenter") == std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe.data.DataLoader's randomness: torch's batches and worker seeds, distinct draws on "
          "every instance, and each sample's draws the same in any worker, instance and run",
          "[pytorch][loader]") {
  SKIP_WITHOUT_TORCH();
  auto checkRun = [](const std::string& out, bool cluster) {
    for (int e : {0, 1}) {
      auto epoch = "check: epoch " + std::to_string(e);
      // Every item's torch.rand() values differ from every other's: no two workers (of one
      // instance or two) drew the same stream.
      std::smatch m;
      std::regex distinct(epoch + R"(: 320 items, torch draws distinct (\d+) of (\d+))");
      REQUIRE(std::regex_search(out, m, distinct));
      CHECK(m[1] == m[2]);
      // The batches torch's own DataLoader makes from the same arguments and generator state.
      CHECK(out.find(epoch + ": torch's batches True") != std::string::npos);
      if (cluster) {
        // get_worker_info() in every worker (which of an instance's 2 made items is timing's);
        // each instance's workers from a base of their own.
        CHECK(all(out, epoch + R"(: instance (algo-\d): get_worker_info ids \[(0|1|0, 1)\] of )"
                               R"(\[2\], base seeds 1)")
                  .size() == 2);
        CHECK(out.find(epoch + ": instances 2, their base seeds distinct True") !=
              std::string::npos);
      }
    }
  };
  // seed=5: a run on the cluster (2 data instances, 2 workers each, shards handed out as they
  // free up) and one under plain python3 (torch's DataLoader, its 2 workers here): the same draws
  // for every sample.
  Run first(harness::sim(kCluster, loaderCheck({"random", "5"})), pythonEnv());
  REQUIRE(first.wait(180s) == 0);
  auto one = first.output();
  Run plain(loaderCheck({"random", "5"}), pythonEnv());
  REQUIRE(plain.wait(120s) == 0);
  auto three = plain.output();
  INFO(one << "\n---- plain python3\n" << three);
  checkRun(one, true);
  checkRun(three, false);
  auto d1 = digests(one), d3 = digests(three);
  REQUIRE(d1.size() == 2);
  CHECK(d1 == d3);
  CHECK(d1[0] != d1[1]);  // other draws each epoch
  // torch.manual_seed(0) alone (the global generator, as torch seeds a run): reproducible too.
  Run global(harness::sim(kCluster, loaderCheck({"random", "global"})), pythonEnv());
  REQUIRE(global.wait(180s) == 0);
  Run globalPlain(loaderCheck({"random", "global"}), pythonEnv());
  REQUIRE(globalPlain.wait(120s) == 0);
  auto g1 = global.output(), g2 = globalPlain.output();
  INFO(g1 << "\n---- plain python3\n" << g2);
  checkRun(g1, true);
  CHECK(digests(g1) == digests(g2));
  CHECK(digests(g1) != d1);
  // No seed at all: fresh draws each run, as torch's.
  Run fresh1(loaderCheck({"random", "none"}), pythonEnv());
  Run fresh2(loaderCheck({"random", "none"}), pythonEnv());
  REQUIRE(fresh1.wait(120s) == 0);
  REQUIRE(fresh2.wait(120s) == 0);
  CHECK(digests(fresh1.output()) != digests(fresh2.output()));
  CHECK(first.leftovers().empty());
  CHECK(global.leftovers().empty());
}

TEST_CASE("troupe.data.DataLoader takes torch's arguments as torch does, and names what it cannot "
          "honour with the alternative",
          "[pytorch][loader]") {
  SKIP_WITHOUT_TORCH();
  auto [code, out] = onCluster({"args"}, 240s);
  INFO(out);
  CHECK(code == 0);
  for (int e : {0, 1}) {
    auto epoch = "check: epoch " + std::to_string(e) + ": ";
    // SubsetRandomSampler: the even indices, each once; its report counts them.
    CHECK(out.find(epoch + "subset: 500 items of 500, 500 distinct, even True") !=
          std::string::npos);
    CHECK(out.find("report samples 500 duplicates 0 missing 0") != std::string::npos);
    // WeightedRandomSampler with replacement: 600 draws, samples drawn twice made twice (the
    // trainer counts positions, so none is a duplicate).
    std::smatch m;
    CHECK(std::regex_search(out, m, std::regex(epoch + R"(weighted: 600 items of 600, \d+ )"
                                                       R"(distinct, .* report samples 600 )"
                                                       R"(duplicates 0 missing 0)")));
    // A batch sampler's batches of 7 (the last 6).
    CHECK(out.find(epoch + "batch_sampler: 1000 items of 1000, 1000 distinct, even False, sizes "
                           "[6, 7]") != std::string::npos);
    // worker_init_fn ran in each worker before its items, once with persistent workers (one
    // seed per worker for the whole job)...
    CHECK(std::regex_search(out, m, std::regex(epoch + R"(worker_init_fn: 1000 items of 1000, )"
                                                       R"(1000 distinct, even False, sizes )"
                                                       R"(\[20\], init calls \[1\], worker )"
                                                       R"(seeds [1-4],)")));
    CHECK(std::regex_search(out, m, std::regex(epoch + R"(batch_size_none: 100 items of 100, )"
                                                       R"(100 distinct)")));
  }
  // ... and again each pass without (other seeds each pass, as torch's workers made anew).
  std::smatch m;
  CHECK(std::regex_search(out, m, std::regex(R"(epoch 1: not_persistent: 1000 items of 1000, )"
                                             R"(1000 distinct, even False, sizes \[20\], init )"
                                             R"(calls \[2\])")));
  CHECK(out.find("check: refused ['batch_sampler', 'batch_size']: ValueError: batch_sampler "
                 "option is mutually exclusive") != std::string::npos);
  CHECK(out.find("check: refused ['generator', 'seed']: ValueError: DataLoader: seed= and "
                 "generator= both given") != std::string::npos);
  CHECK(out.find("check: refused ['prefetch']: TypeError: DataLoader: unknown argument(s) "
                 "prefetch") != std::string::npos);
  CHECK(out.find("check: IterableDataset: TypeError: DataLoader: the dataset has no len() or is "
                 "an IterableDataset") != std::string::npos);
  CHECK(out.find("check: IterableDataset with local=True: [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]") !=
        std::string::npos);
  CHECK(out.find("troupe.data: pin_memory=True: no CUDA on this instance; batches are not "
                 "pinned") != std::string::npos);
  CHECK(out.find("check: timeout: RuntimeError: DataLoader timed out after 1 seconds") !=
        std::string::npos);
  CHECK(out.find("check: done") != std::string::npos);
}

TEST_CASE("several troupe.data.DataLoaders in one script: training and validation on the data "
          "group, a test loader on the instance, each with its own reports",
          "[pytorch][loader]") {
  SKIP_WITHOUT_TORCH();
  auto [code, out] = onCluster({"loaders"}, 240s);
  INFO(out);
  CHECK(code == 0);
  for (int e : {0, 1}) {
    auto epoch = "check: epoch " + std::to_string(e) + ": ";
    CHECK(out.find(epoch + "train: 300 items, each once True, made on the data group, report "
                           "300") != std::string::npos);
    CHECK(out.find(epoch + "validation: 100 items, each once True, made on the data group, "
                           "report 100") != std::string::npos);
    CHECK(out.find(epoch + "test: 50 items, each once True, made on this instance, report "
                           "None") != std::string::npos);
  }
  CHECK(out.find("check: a lambda in a later loader: TypeError: DataLoader: this loader's dataset "
                 "or functions cannot be pickled") != std::string::npos);
  // The validation loader's workers: one on each data instance that made its batches (its 7
  // batches are one shard: one instance), said as DataLoader 1's.
  CHECK(!all(out, R"(DataLoader 1 on (algo-\d): 1 worker process \(pid \d+\))").empty());
}

TEST_CASE("troupe.data.DataLoader's reports follow the script's epochs: a peek is named as one, "
          "set_epoch() files them",
          "[pytorch][loader]") {
  SKIP_WITHOUT_TORCH();
  auto [code, out] = onCluster({"peek"}, 180s);
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("check: epoch 0: 200 items") != std::string::npos);
  CHECK(out.find("check: epoch 1: 200 items") != std::string::npos);
  // The peek took one batch; the rest of its pass was not made, nor counted as an epoch.
  CHECK(out.find("check: reports {0: 200, 1: 200}, peeks [(0, 1, 190)]") != std::string::npos);
  CHECK(out.find("DataLoader 0: a peek at epoch 0: 10 samples") != std::string::npos);
  CHECK(out.find("check: set_epoch reports [5, 6]") != std::string::npos);
}

TEST_CASE("a file of an ImageFolder that cannot be read fails a DataLoader job naming the file, "
          "the worker and the instance, its traceback printed once",
          "[pytorch][loader][bad-input]") {
  SKIP_WITHOUT_TORCH();
  SKIP_WITHOUT_TORCHVISION();
  troupe::testing::TempDir images("troupe-badfile");
  auto cluster = kCluster;
  cluster.insert(cluster.begin(), "--keep");
  Run run(harness::sim(cluster, loaderCheck({"badfile", images.path()})), pythonEnv());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 1);
  auto failure = headFailure(run);
  INFO("output/failure: " << failure);
  auto file = images.path() + "/class1/broken.jpg";
  std::smatch m;
  CHECK(std::regex_search(failure, m,
                          std::regex(R"(dataset\[\d+\] \()" + file +
                                     R"(\) raised \w+: .* \(epoch 0, )"
                                     R"(DataLoader worker \d of 2 on algo-\d\))")));
  CHECK(failure.find("Traceback") != std::string::npos);
  // The worker's traceback: once in the whole output (the script's exception), every other line
  // that names the failure says its first line only.
  CHECK(harness::count(out, "in the DataLoader worker:") == 1);
  CHECK(harness::count(out, "in __getitem__") == 1);
  CHECK(run.leftovers().empty());
}

// The wire's check (issue 49): a data worker whose replies claim a shape their bytes do not hold
// (1000 more rows) is refused where the batch is taken, named with its dtype, shape and bytes; the
// job ends 1 and no array is made over bytes that are not there.
TEST_CASE("a DataLoader worker that lies about a tensor's shape fails the job naming the tensor, "
          "no array made past its bytes",
          "[pytorch][loader][bad-input]") {
  SKIP_WITHOUT_TORCH();
  auto cluster = kCluster;
  cluster.insert(cluster.begin(), "--keep");
  Run run(harness::sim(cluster, loaderCheck({"lying"})), pythonEnv());
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 1);
  CHECK(out.find("check: FAILED") == std::string::npos);
  auto failure = headFailure(run);
  INFO("output/failure: " << failure);
  CHECK(std::regex_search(failure, std::regex(R"(DataLoader worker 0 on algo-\d answered with )"
                                              R"(what is not a batch: a tensor of dtype <f4, )"
                                              R"(shape \[10[0-9][0-9],4\] and [0-9]+ bytes)")));
  CHECK(run.leftovers().empty());
}

// issue 50: torchvision's ImageFolder with a Compose troupe runs, given to troupe's DataLoader
// unchanged, is decoded and transformed by the data group's C++ pipeline; the oracle is
// torchvision itself, run in the script on the same files.
TEST_CASE(
    "torchvision's ImageFolder and Compose run on the data group's C++ pipeline, its "
    "tensors torchvision's own, and what it cannot translate stays in Python workers",
    "[pytorch][loader][images]") {
  SKIP_WITHOUT_TORCH();
  SKIP_WITHOUT_TORCHVISION();
  troupe::testing::TempDir dir("troupe-translated");
  auto data = imageFolder(dir);
  Run run(harness::sim(kCluster, loaderCheck({"translated", data})), pythonEnv());
  int code = run.wait(240s);
  auto out = run.output();
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("check: FAILED") == std::string::npos);
  CHECK(out.find("troupe.data: DataLoader 0: torchvision's ImageFolder " + data +
                 " is decoded and transformed by the data group's C++ pipeline: "
                 "RandomResizedCrop(size=(16, 16), scale=(0.08, 1.0), ratio=(0.75, "
                 "1.3333333333333333)),RandomHorizontalFlip(p=0.5),ColorJitter(brightness=(0.6, "
                 "1.4), contrast=(0.6, 1.4), saturation=(0.6, 1.4)),Normalize(") !=
        std::string::npos);
  for (auto epoch : {"0", "1"}) {
    CHECK(out.find(std::string("check: epoch ") + epoch +
                   ": 300 of 300 samples once, targets torchvision's") != std::string::npos);
  }
  CHECK(out.find("check: a fixed Compose against torchvision's: max |diff| ") != std::string::npos);
  CHECK(out.find("check: a first Resize (DCT-scaled decodes) against torchvision's: ") !=
        std::string::npos);
  CHECK(std::regex_search(out, std::regex("the dataset's transform runs in Python workers: "
                                          "translate=False")));
  CHECK(out.find("the dataset's transform runs in Python workers: RandAugment is not a "
                 "transform troupe's pipeline runs") != std::string::npos);
  CHECK(out.find("check: translate=False: 300 samples through Python workers") !=
        std::string::npos);
  CHECK(out.find("check: RandAugment: 300 samples through Python workers") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe.data.ImageDataset through a DataLoader draws the same pixels on the data group's "
          "C++ pipeline as under plain python3, with its own seed and the script's epoch or with "
          "the loader's per-sample seeds",
          "[pytorch][loader][images]") {
  SKIP_WITHOUT_TORCH();
  troupe::testing::TempDir dir("troupe-imageseeds");
  auto data = imageFolder(dir);
  Run cluster(harness::sim(kCluster, loaderCheck({"images", data})), pythonEnv());
  REQUIRE(cluster.wait(180s) == 0);
  Run plain(loaderCheck({"images", data}), pythonEnv());
  REQUIRE(plain.wait(120s) == 0);
  auto one = cluster.output(), two = plain.output();
  INFO(one << "\n---- plain python3\n" << two);
  auto pixels = [](const std::string& out) {
    return all(out, R"(check: epoch \d: [a-z' ]+: 300 samples, pixels (\w+))");
  };
  REQUIRE(pixels(one).size() == 4);
  CHECK(pixels(one) == pixels(two));
  // Another epoch, other draws (set_epoch reaches the dataset on the data group too).
  CHECK(pixels(one)[0] != pixels(one)[2]);
  CHECK(pixels(one)[1] != pixels(one)[3]);
  CHECK(cluster.leftovers().empty());
}
