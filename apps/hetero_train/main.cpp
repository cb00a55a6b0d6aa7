// hetero_train: the seeds' job on troupe. Augmenter actors on the data group stream augmented
// Fashion-MNIST batches straight to a trainer actor on the dnn group, which trains an MLP (CUDA
// when there is a GPU, Thrust's CPU back end otherwise). Run without flags for the defaults;
// `--help` lists the settings. Nothing here names a host, detects a role, or signals an exit:
// troupe does that.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <deque>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "train.capnp.h"
#include "augmenter_actor.h"
#include "augmenter_spawn.h"
#include "checkpoint.h"
#include "end_report.h"
#include "advise.h"
#include "prices.h"
#include "trainer_actor.h"
#include "troupe/trainer/mlp.h"
#include "troupe/cli11.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"
#include "troupe/sagemaker.h"
#include "troupe/sched/instance_types.h"
#include "troupe/troupe.h"

namespace {

using troupe::Placement;

struct Settings {
  unsigned epochs = 5;
  unsigned batchSize = 128;
  float learningRate = 0;  // unset: 0.05 for Fashion-MNIST, 0.01 for a dataset (wider input)
  float momentum = 0.9f;
  unsigned prefetch = 4;
  std::string augment = "heavy";  // the AugmentConfig preset
  int blur = -1;                   // -1: the preset's
  troupe::augment::AugmentConfig augmentConfig;
  uint64_t seed = 42;
  uint64_t samples = 0;  // 0 = all 60,000
  unsigned perNode = 0;  // augmenters per data node; 0 = one per vCPU
  unsigned restarts = 3;
  double progressEvery = 3;  // seconds between progress lines
  std::string dataDir = troupe::data::kDefaultFashionMnistDir;
  std::string modelDir;
  std::string report;
  std::string device = "auto";
  std::string dataGroup = "data_group";
  std::string dnnGroup = "dnn_group";
  std::string checkpointDir;  // empty: no checkpoints
  unsigned checkpointEvery = 100;
  unsigned checkpointKeep = 2;
  bool fresh = false;
  unsigned killDuringCheckpoint = 0;  // test hook (hidden flag)
  std::string priceFile;
  std::string pricing = "on-demand";
  hetero_train::Prices prices;
  // A dataset of any kind (--dataset), decoded and transformed on the data group by --transform;
  // Fashion-MNIST's IDX files without --transform keep the augmenter of --augment instead.
  std::string dataset, transform, testDataset, testTransform;
  bool skipBadSamples = false;
  bool dropLast = false;  // --dataset: each epoch's last, short batch left out
  std::shared_ptr<const troupe::data::Source> source;  // opened at start (sharedSource)
  troupe::images::Shape shape;                         // a sample as the transform writes it
  troupe::images::Dtype dtype = troupe::images::Dtype::kUint8;
  uint32_t classes = 0;
};

// ImageNet's training recipe (torchvision's references): the default transform for images.
constexpr const char* kImageTransform =
    "RandomResizedCrop(224),RandomHorizontalFlip(),Normalize(imagenet)";

// What a checkpoint must share with this job to be resumed by it (checkpoint.h).
troupe::train::JobIdentity jobIdentity(const Settings& s) {
  troupe::train::JobIdentity id;
  id.trainSamples = s.samples;
  id.batchSize = s.batchSize;
  id.layerSizes = troupe::trainer::MlpConfig().layerSizes;
  if (s.source) {
    id.layerSizes.front() = int(s.shape.elements());
    id.layerSizes.back() = int(s.classes);
  }
  id.seed = s.seed;
  id.epochs = s.epochs;
  id.learningRate = s.learningRate;
  id.momentum = s.momentum;
  return id;
}

// Parses and checks the app's flags on every node, before anything starts: a bad value, an unknown
// flag or an unknown hyperparameter is a configuration error (exit 2, and output/failure on
// SageMaker) everywhere at once.
// Under a SageMaker root with no `train` channel, the dataset must not silently become the one in
// the image: a misnamed channel ("training") or a declared `train` whose folder is missing is a
// configuration error naming what is there; with no channel at all the image's dataset is used,
// with a warning that says so. An explicit --data-dir (flag or hyperparameter) is the user's.
void checkNoTrainChannel(const troupe::SageMakerEnv& sm, const std::string& dataDir,
                         const std::string& dataset) {
  if (dataDir != troupe::data::kDefaultFashionMnistDir || !dataset.empty()) return;
  std::vector<std::string> declared;
  try {
    std::ifstream in(sm.path("input/config/inputdataconfig.json"));
    if (in) {
      // Iterators, not items() with a structured binding: ASan reports a stack-use-after-scope
      // in nlohmann 3.11.2's iteration_proxy there.
      auto config = nlohmann::json::parse(in);
      for (auto it = config.begin(); it != config.end(); ++it) {
        if (it.key() != "troupe-secret") declared.push_back(it.key());
      }
    }
  } catch (const nlohmann::json::exception&) {
    // SageMaker writes that file; a damaged one says nothing here.
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string text;
    for (auto& x : v) text += (text.empty() ? "" : ", ") + x;
    return text.empty() ? std::string("none") : text;
  };
  bool trainDeclared = std::find(declared.begin(), declared.end(), "train") != declared.end();
  if (trainDeclared) {
    troupe::configError("the 'train' channel is declared in " +
                        sm.path("input/config/inputdataconfig.json") + " but " +
                        sm.path("input/data/train") + " does not exist (channels there: " +
                        list(sm.channels()) + "); check the channel's S3 input");
  }
  if (!sm.channels().empty() || !declared.empty()) {
    troupe::configError("no 'train' channel under " + sm.path("input/data") + " (channels: " +
                        list(sm.channels().empty() ? declared : sm.channels()) +
                        "); hetero_train reads its dataset from the channel named 'train': "
                        "rename the channel, or give --dataset (the dataset hyperparameter)");
  }
  spdlog::warn("no input channels under {}: training on the Fashion-MNIST installed here ({}, the "
               "image's copy on SageMaker); give a 'train' channel to train on your data",
               sm.path("input/data"), dataDir);
}

// --dataset: opened here, on every node before anything starts (the file list is kept for the
// augmenters of this process: sharedSource), and the transform parsed against it. What cannot
// be used is a configuration error (exit 2) naming it and what is allowed. Fashion-MNIST's IDX
// files without --transform go to the --augment augmenter, as --data-dir does.
void openDataset(Settings& s) {
  namespace data = troupe::data;
  namespace images = troupe::images;
  if (s.dataset.empty()) {
    if (!s.transform.empty() || !s.testDataset.empty() || !s.testTransform.empty() ||
        s.dropLast) {
      throw troupe::ConfigError("--transform, --test-dataset, --test-transform and --drop-last "
                                "need --dataset PATH (your dataset; docs/data.md)");
    }
    return;
  }
  std::shared_ptr<const data::Source> source;
  try {
    source = troupe::train::sharedSource(s.dataset);
  } catch (const data::SourceError& e) {
    throw troupe::ConfigError(std::string("--dataset: ") + e.what());
  }
  if (source->kind() == "IDX" && s.transform.empty()) {
    s.dataDir = s.dataset;  // today's Fashion-MNIST path: the --augment preset
    s.dataset.clear();
    return;
  }
  if (s.transform.empty()) s.transform = kImageTransform;
  int channels = source->encoding() == data::Encoding::kRawGrey8 ? 1 : 3;
  try {
    auto pipeline = images::Pipeline::parse(s.transform);
    s.shape = pipeline.outputShape(channels);
    s.dtype = pipeline.dtype();
    if (s.testTransform.empty()) s.testTransform = pipeline.evaluationSpec(channels);
    s.transform = pipeline.describe();
  } catch (const images::SpecError& e) {
    throw troupe::ConfigError(std::string("--transform: ") + e.what());
  }
  s.classes = uint32_t(source->classes().size());
  if (s.classes < 2 || s.classes > 256) {
    throw troupe::ConfigError("--dataset " + s.dataset + " has " + std::to_string(s.classes) +
                              " classes; hetero_train's MLP classifies 2 to 256 (a PyTorch "
                              "model through troupe.data takes any number: docs/pytorch.md)");
  }
  if (!s.testDataset.empty()) {
    try {
      auto test = data::openSource(s.testDataset);
      if (test->classes().size() > s.classes) {
        throw troupe::ConfigError("--test-dataset " + s.testDataset + " has " +
                                  std::to_string(test->classes().size()) + " classes, --dataset " +
                                  std::to_string(s.classes) + ": give both the same classes");
      }
      auto pipeline = images::Pipeline::parse(s.testTransform);
      int testChannels = test->encoding() == data::Encoding::kRawGrey8 ? 1 : 3;
      auto shape = pipeline.outputShape(testChannels);
      if (shape.elements() != s.shape.elements() || pipeline.dtype() != s.dtype) {
        throw troupe::ConfigError("--test-transform writes " + std::to_string(shape.elements()) +
                                  " " + images::dtypeName(pipeline.dtype()) +
                                  " values a sample, --transform " +
                                  std::to_string(s.shape.elements()) + " " +
                                  images::dtypeName(s.dtype) + ": give them the same output");
      }
    } catch (const data::SourceError& e) {
      throw troupe::ConfigError(std::string("--test-dataset: ") + e.what());
    } catch (const images::SpecError& e) {
      throw troupe::ConfigError(std::string("--test-transform: ") + e.what());
    }
  }
  s.source = kj::mv(source);
}

Settings parseSettings(int argc, char* argv[]) {
  Settings s;
  CLI::App cli("hetero_train: augmentation on the data group, training on the dnn group");
  cli.footer("troupe's own options (--cluster, --token-file, --head-group, ...): --troupe-help\n");
  cli.add_option("--epochs", s.epochs, "epochs")->check(CLI::Range(1u, 1000u));
  cli.add_option("--batch-size", s.batchSize, "samples per batch")->check(CLI::Range(1u, 8192u));
  cli.add_option("--lr", s.learningRate,
                 "learning rate (decays linearly to 0; default 0.05, 0.01 with --dataset)")
      ->check(CLI::Range(1e-6f, 10.0f));
  cli.add_option("--momentum", s.momentum)->check(CLI::Range(0.0f, 0.999f));
  cli.add_option("--prefetch", s.prefetch, "batches in flight per augmenter")
      ->check(CLI::Range(1u, 64u));
  cli.add_option("--augment", s.augment,
                 "heavy: a vision pipeline's cost (random resized crop to 56x56, flip, affine, "
                 "jitter, noise, back to 28x28: ~34 us per image); light: crop, flip, affine, "
                 "jitter and noise at 28x28 (~11 us)")
      ->check(CLI::IsMember({"heavy", "light"}))
      ->capture_default_str();
  cli.add_option("--blur", s.blur,
                 "Gaussian blur kernel (0 = off; odd 3..99; adds to --augment's cost)");
  cli.add_option("--seed", s.seed);
  cli.add_option("--train-samples", s.samples, "use the first N training samples (0 = all)");
  cli.add_option("--augmenters-per-node", s.perNode, "per data node (0 = one per vCPU)");
  cli.add_option("--restarts", s.restarts, "restarts per augmenter within a minute");
  cli.add_option("--progress-every", s.progressEvery, "seconds between progress lines")
      ->check(CLI::Range(0.1, 3600.0));
  cli.add_option("--data-dir", s.dataDir, "Fashion-MNIST IDX files");
  cli.add_option("--dataset", s.dataset,
                 "your dataset: an ImageFolder, a manifest (.csv, .jsonl), WebDataset .tar shards "
                 "or IDX files (docs/data.md; default on SageMaker: the 'train' channel)");
  cli.add_option("--transform", s.transform,
                 std::string("the data group's transforms, torchvision's names (docs/data.md); "
                             "default for images: ") +
                     kImageTransform + "; for IDX files: the --augment preset");
  cli.add_option("--test-dataset", s.testDataset,
                 "the dataset the trainer's accuracy is measured on (default on SageMaker: the "
                 "'test' channel; none: no accuracy)");
  cli.add_option("--test-transform", s.testTransform,
                 "default: Resize to 8/7 and CenterCrop to --transform's output size, then its "
                 "Normalize, dtype and layout");
  cli.add_flag("--skip-bad-samples{true}", s.skipBadSamples,
               "a training sample that cannot be read is skipped and listed in the report, "
               "instead of failing the job")
      ->expected(0, 1);
  cli.add_option("--model-dir", s.modelDir, "where to save the model (empty: don't)");
  cli.add_option("--report", s.report, "write the report as JSON to this path");
  cli.add_option("--device", s.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cli.add_option("--data-group", s.dataGroup, "the instance group for augmentation");
  cli.add_option("--dnn-group", s.dnnGroup, "the instance group for training (and the head)");
  cli.add_option("--checkpoint-dir", s.checkpointDir,
                 "where the trainer writes checkpoints and resumes from (default on SageMaker: "
                 "<root>/checkpoints when it exists; empty: no checkpoints)");
  cli.add_option("--checkpoint-every", s.checkpointEvery,
                 "training steps between checkpoints (0: only when the job is stopped early)")
      ->check(CLI::Range(0u, 1000000u));
  cli.add_option("--checkpoint-keep", s.checkpointKeep, "how many of the newest to keep")
      ->check(CLI::Range(1u, 100u));
  // Also `--fresh true|false`: how a hyperparameter arrives (deploy/sagemaker/train passes
  // `--fresh true`), and `fresh: "true"` in hyperparameters.json.
  cli.add_flag("--fresh{true}", s.fresh,
               "set the checkpoint folder's checkpoints aside (into discarded-<time>/) and start "
               "over, instead of resuming or refusing them")
      ->expected(0, 1);
  cli.add_flag("--drop-last{true}", s.dropLast,
               "with --dataset: leave out each epoch's last batch when it is short (every batch "
               "is --batch-size samples, as torch's DataLoader(drop_last=True))")
      ->expected(0, 1);
  cli.add_option("--test-kill-during-checkpoint", s.killDuringCheckpoint)
      ->group("");  // tests only: SIGKILL the trainer's process inside its N-th checkpoint write
  cli.add_option("--prices", s.priceFile,
                 "a CSV price file (instance_type,on_demand_usd_per_hour,spot_usd_per_hour) for "
                 "the cost table");
  cli.add_option("--pricing", s.pricing, "price the cluster on-demand or spot")
      ->check(CLI::IsMember({"on-demand", "spot"}));
  try {
    // On SageMaker (or under `troupe sim --hp`) the same settings arrive as hyperparameters, with
    // `_` or `-`; the model goes to the model dir and a `train` channel, if any, is the dataset.
    // Flags on the command line win.
    std::vector<std::string> defaults;
    auto sm = troupe::SageMakerEnv::detect();
    if (sm.active()) {
      if (sm.hasChannel("train"))
        defaults.insert(defaults.end(), {"--dataset", sm.channelDir("train")});
      if (sm.hasChannel("test"))
        defaults.insert(defaults.end(), {"--test-dataset", sm.channelDir("test")});
      defaults.insert(defaults.end(), {"--model-dir", sm.modelDir()});
      // output/data is uploaded as output.tar.gz (and kept by `troupe sim`).
      defaults.insert(defaults.end(), {"--report", sm.outputDataDir() + "/report.json"});
      // SageMaker syncs checkpoint_s3_uri into /opt/ml/checkpoints before the job starts.
      if (std::filesystem::is_directory(sm.checkpointDir()))
        defaults.insert(defaults.end(), {"--checkpoint-dir", sm.checkpointDir()});
    }
    troupe::parseAppFlags(cli, argc, argv, defaults, sm);
    if (sm.active() && !sm.hasChannel("train")) checkNoTrainChannel(sm, s.dataDir, s.dataset);
    openDataset(s);
    if (s.learningRate == 0) s.learningRate = s.source ? 0.01f : 0.05f;
    s.augmentConfig = s.augment == "light" ? troupe::augment::AugmentConfig::light()
                                           : troupe::augment::AugmentConfig::heavy();
    if (s.blur >= 0) s.augmentConfig.blurKernel = s.blur;
    s.augmentConfig.validate();
  } catch (const troupe::ConfigError& e) {
    troupe::configError(e.what());
  } catch (const std::invalid_argument& e) {
    troupe::configError(std::string("--blur: ") + e.what());
  }
  try {
    if (!s.priceFile.empty()) s.prices = hetero_train::Prices::load(s.priceFile);
  } catch (const std::invalid_argument& e) {
    troupe::configError(std::string("--prices: ") + e.what());
  }
  if (s.pricing == "spot" && s.priceFile.empty()) {
    troupe::configError(
        "--pricing spot needs --prices FILE with a spot_usd_per_hour column: spot prices change "
        "with region and time (see deploy/sagemaker/prices-example.csv)");
  }
  // A checkpoint this job cannot resume is refused on every node before anything starts, naming
  // the file and what to do; the job starts over only when told to (--fresh).
  if (!s.checkpointDir.empty() && !s.fresh) {
    try {
      troupe::train::CheckpointDir(s.checkpointDir).latest(jobIdentity(s));
    } catch (const troupe::train::CheckpointError& e) {
      troupe::configError(e.what());
    }
  }
  return s;
}

using hetero_train::hex;

std::string fmt(const char* format, double v) {
  char buf[64];
  snprintf(buf, sizeof(buf), format, v);
  return buf;
}

struct Placed {
  std::string actor, type, host, group;
};

class Job {
 public:
  Job(troupe::Driver& job, Settings settings) : job_(job), s_(kj::mv(settings)) {}

  troupe::Co<void> run() {
    // Check the dataset before any work starts, on the pool: unpacking it takes long enough to
    // starve the head's heartbeats if done on the event loop.
    auto count = job_.loop().offload([dir = s_.dataDir, source = s_.source]() {
      if (source) return source->size();
      return troupe::data::loadFashionMnist(dir, troupe::data::Split::kTrain).size();
    });
    size_t available = co_await kj::mv(count);  // (no lambda inside co_await: see troupe/co.h)
    KJ_REQUIRE(s_.samples <= available, "--train-samples is larger than the training set",
               s_.samples, available);
    if (s_.source) {
      printf("dataset: %s (%s), %zu samples, %u classes; transform %s -> %s %dx%dx%d\n",
             s_.source->where().c_str(), s_.source->kind().c_str(), s_.source->size(),
             s_.classes, s_.transform.c_str(), troupe::images::dtypeName(s_.dtype),
             s_.shape.channelsFirst ? s_.shape.channels : s_.shape.height,
             s_.shape.channelsFirst ? s_.shape.height : s_.shape.width,
             s_.shape.channelsFirst ? s_.shape.width : s_.shape.channels);
      fflush(stdout);
    }
    samples_ = s_.samples ? s_.samples : available;
    co_await start();
  }

 private:
  // The trainer goes to the dnn group, on a GPU when it has one. A cluster without that group (a
  // homogeneous one) runs it on the head, which then fate-shares with it as it does on the dnn
  // group's first host (troupe::run() chose the head with a warning already).
  Placement trainerPlacement() {
    bool found = false, gpus = false;
    for (auto& n : job_.nodes()) {
      if (n.group() != s_.dnnGroup.c_str()) continue;
      found = true;
      gpus = gpus || n.gpus() > 0;
    }
    if (found) return Placement::group(s_.dnnGroup).gpus(gpus ? 1 : 0);
    auto& head = job_.node();
    return Placement::any()
        .labels(std::string("host=") + head.host().cStr())
        .gpus(head.gpus() > 0 ? 1 : 0);
  }

  kj::Promise<void> start() {
    auto trainer = job_.spawn<hetero::Trainer>(
        trainerPlacement(),
        troupe::SpawnOptions()
            .named("trainer")
            .args<hetero::TrainerArgs>([&](auto a) {
              a.setBatchSize(s_.batchSize);
              a.setLearningRate(s_.learningRate);
              a.setMomentum(s_.momentum);
              a.setSeed(s_.seed);
              a.setPrefetch(s_.prefetch);
              a.setDataDir(s_.dataDir);
              a.setModelDir(s_.modelDir);
              a.setDevice(s_.device);
              a.setCheckpointDir(s_.checkpointDir);
              a.setCheckpointEvery(s_.checkpointEvery);
              a.setCheckpointKeep(s_.checkpointKeep);
              a.setFresh(s_.fresh);
              a.setSamplesSetting(s_.samples);
              a.setKillDuringCheckpoint(s_.killDuringCheckpoint);
              if (s_.source) {
                troupe::train::setSampleFormat(a.initSample(), s_.shape, s_.dtype, s_.classes);
                a.setTestDataset(s_.testDataset);
                a.setTestTransform(s_.testTransform);
                troupe::train::setBatchedOrder(a.initOrder(), true, s_.dropLast);
              }
            })
            // Stopped early (SIGTERM), it finishes its step and writes a checkpoint: seconds,
            // well within SageMaker's 120 s between SIGTERM and SIGKILL.
            .stopTimeout(30 * kj::SECONDS));
    auto augmenters =
        job_.spawnMany<hetero::Augmenter>(troupe::train::augmenterPlacement(augmenterSpec()),
                                          troupe::train::augmenterOptions(augmenterSpec(), "augmenter"));
    placed_.push_back(
        {"trainer", "train.Trainer", trainer.address().host, trainer.address().group});
    for (auto& a : augmenters) {
      placed_.push_back({a.address().name, "train.Augmenter", a.address().host, a.address().group});
    }
    printPlacements();
    reportOnEveryEnd();
    augmenters_.assign(augmenters.begin(), augmenters.end());
    // A data node that joins the running job (a late host, one started again after a crash or a
    // partition) gets augmenters of its own, which take shards from the trainer's queue at once.
    troupe::train::growOnJoin(
        job_, augmenterSpec(), troupe::train::trainerList(kj::arrayPtr(&trainer, 1)),
        augmenters, tasks_,
        [this](const std::string& host, kj::ArrayPtr<troupe::Ref<hetero::Augmenter>> added) {
          for (auto& a : added) {
            placed_.push_back({a.address().name, "train.Augmenter", host, a.address().group});
            end_->placements.push_back({{"actor", a.address().name},
                                        {"type", "train.Augmenter"},
                                        {"host", host},
                                        {"group", a.address().group}});
            augmenters_.emplace_back(a);
          }
        });

    auto req = trainer.trainRequest();
    req.setEpochs(s_.epochs);
    req.setTrainSamples(samples_);
    auto sources = req.initSources(augmenters.size());
    for (size_t i = 0; i < augmenters.size(); ++i) augmenters[i].address().toProto(sources[i]);
    // After training, each augmenter's stats(): the advisor's augmentation rate per vCPU.
    auto done =
        req.send().then([this](capnp::Response<hetero::Trainer::TrainResults>&& r) mutable {
          auto results = kj::heap(kj::mv(r));
          auto stats = gatherStats(placed_.front().host);
          return kj::Promise<AugmentStats>(kj::mv(stats))
              .then([this, results = kj::mv(results)](AugmentStats st) mutable { report(*results, st); });
        });
    return done.exclusiveJoin(progressLoop(trainer)).attach(kj::mv(augmenters));
  }

  // A job that ends before report() (SIGTERM, a failed actor, a lost node) still says what it
  // trained, and writes report.json with it (end_report.h): after the cascade, so the trainer's
  // checkpoint written as it stopped is the one read.
  void reportOnEveryEnd() {
    end_->reportPath = s_.report;
    end_->checkpointDir = s_.checkpointDir;
    end_->identity = jobIdentity(s_);
    end_->epochs = s_.epochs;
    for (auto& p : placed_) {
      end_->placements.push_back(
          {{"actor", p.actor}, {"type", p.type}, {"host", p.host}, {"group", p.group}});
    }
    job_.onJobEnd([state = end_, &job = job_](const troupe::JobEnd& end) {
      if (state->reported) return;
      nlohmann::json instances = nlohmann::json::array();
      for (auto& n : job.nodes()) {
        instances.push_back({{"host", n.host().cStr()},
                             {"group", n.group().cStr()},
                             {"instance_type", n.instanceType().cStr()},
                             {"vcpus", n.vcpus()}});
      }
      hetero_train::reportEnd(*state, end, kj::mv(instances), job.membershipChanges());
    });
  }

  // What hetero_train's augmenters are (augmenter_spawn.h).
  troupe::train::AugmenterSpec augmenterSpec() const {
    troupe::train::AugmenterSpec spec;
    spec.seed = s_.seed;
    spec.batchSize = s_.batchSize;
    spec.dataDir = s_.dataDir;
    spec.samples = samples_;
    spec.augment = s_.augmentConfig;
    spec.restarts = s_.restarts;
    spec.perNode = s_.perNode;
    spec.dataGroup = s_.dataGroup;
    spec.dataset = s_.dataset;
    spec.transform = s_.transform;
    spec.skipBadSamples = s_.skipBadSamples;
    spec.batched = s_.source != nullptr;
    spec.dropLast = s_.dropLast;
    return spec;
  }

  void printPlacements() {
    printf("\n%-14s %-16s %-8s %s\n", "actor", "type", "host", "group");
    for (auto& p : placed_) {
      printf("%-14s %-16s %-8s %s\n", p.actor.c_str(), p.type.c_str(), p.host.c_str(),
             p.group.c_str());
    }
    printf("\n");
    fflush(stdout);
  }

  troupe::Co<void> progressLoop(troupe::Ref<hetero::Trainer> trainer) {
    // Runs until the training call returns, which drops (cancels) it. On a terminal the line is
    // redrawn in place twice a second; otherwise (troupe sim, a log file) a new line each time.
    // The trainer is asked every second at most, for what a job that ends early reports.
    double seconds = live_ ? std::min(s_.progressEvery, 0.5) : s_.progressEvery;
    auto every = static_cast<int64_t>(seconds * 1000) * kj::MILLISECONDS;
    auto poll = std::min(every, 1000 * kj::MILLISECONDS);
    auto nextLine = job_.timer().now() + every;
    for (;;) {
      co_await job_.timer().afterDelay(poll);
      auto p = co_await trainer.progressRequest().send();
      double secs = p.getSeconds();
      uint64_t steps = p.getSteps();
      uint64_t total = p.getPlannedSteps();
      end_->progress = {true, p.getEpoch(), steps, total, p.getSamples(), secs,
                        std::chrono::steady_clock::now()};
      if (job_.timer().now() < nextLine) continue;
      nextLine = job_.timer().now() + every;
      // This run's pace: a resumed run did not do the steps the checkpoint brought.
      uint64_t mine = steps - std::min(steps, p.getResumedSteps());
      double rate = secs > 0 ? (p.getSamples() - p.getResumedSamples()) / secs : 0;
      double eta = mine ? secs * double(total - std::min(total, steps)) / mine : 0;
      printf(
          "%sprogress: epoch %u/%u, step %lu/%lu, %.0f samples/s, data wait %.0f%%, ETA %.0f s%s",
          live_ ? "\r" : "", p.getEpoch() + 1, s_.epochs, (unsigned long)steps,
          (unsigned long)total, rate, secs > 0 ? 100 * p.getWaitSeconds() / secs : 0, eta,
          live_ ? "\x1b[K" : "\n");
      fflush(stdout);
    }
  }

  struct AugmentStats {
    uint64_t images = 0, batches = 0, bytes = 0;
    double seconds = 0;
    double secondsBesideTrainer = 0;  // of `seconds`: on the trainer's host (in its process)
    double loadSeconds = 0;           // loading shards, all augmenters
    unsigned answered = 0, lost = 0;
  };

  // Each augmenter's stats(); one gone for good (its restarts spent) is counted as lost.
  // Every augmenter's stats() at once, each within 2 s: a slow node's answer (its link still
  // full of pushes the trainer no longer wanted) must not hold the job's end for each of its
  // augmenters in turn. One that does not answer is counted as lost.
  kj::Promise<AugmentStats> gatherStats(std::string trainerHost) {
    struct One {
      uint64_t images, batches, bytes;
      double seconds, loadSeconds;
      bool beside;
    };
    auto calls = kj::heapArrayBuilder<kj::Promise<kj::Maybe<One>>>(augmenters_.size());
    for (auto& a : augmenters_) {
      bool beside = a.address().host == trainerHost;
      calls.add(job_.timer()
                    .timeoutAfter(2 * kj::SECONDS, a.statsRequest().send())
                    .then(
                        [beside](auto r) -> kj::Maybe<One> {
                          return One{r.getImages(),         r.getBatches(),     r.getBytes(),
                                     r.getAugmentSeconds(), r.getLoadSeconds(), beside};
                        },
                        [](kj::Exception&&) -> kj::Maybe<One> { return nullptr; }));
    }
    return kj::joinPromises(calls.finish()).then([](kj::Array<kj::Maybe<One>> all) {
      AugmentStats st;
      for (auto& maybe : all) {
        KJ_IF_MAYBE(r, maybe) {
          st.images += r->images;
          st.batches += r->batches;
          st.bytes += r->bytes;
          st.seconds += r->seconds;
          if (r->beside) st.secondsBesideTrainer += r->seconds;
          st.loadSeconds += r->loadSeconds;
          ++st.answered;
        } else {
          ++st.lost;
        }
      }
      return st;
    });
  }

  void report(capnp::Response<hetero::Trainer::TrainResults>& r, const AugmentStats& st) {
    if (live_) printf("\n");  // end the live progress line
    printf("\ntrainer device: %s\n\n", r.getDevice().cStr());
    printf("%5s %9s %10s %8s %9s %8s %9s %8s\n", "epoch", "samples", "duplicates", "missing",
           "rejected", "skipped", "accuracy", "seconds");
    double seconds = 0, wait = 0, stepSeconds = 0, stepCpuSeconds = 0, fill = 0;
    unsigned epochCount = 0;
    uint64_t steps = 0, samples = 0;
    nlohmann::json epochs = nlohmann::json::array();
    for (auto e : r.getEpochs()) {
      printf("%5u %9lu %10lu %8lu %9lu %8lu %9.4f %8.1f\n", e.getEpoch() + 1,
             (unsigned long)e.getSamples(), (unsigned long)e.getDuplicates(),
             (unsigned long)e.getMissing(), (unsigned long)e.getRejected(),
             (unsigned long)e.getSkipped(), e.getTestAccuracy(), e.getSeconds());
      seconds += e.getSeconds();
      wait += e.getWaitSeconds();
      stepSeconds += e.getStepSeconds();
      stepCpuSeconds += e.getStepCpuSeconds();
      fill += e.getFillSeconds();
      ++epochCount;
      steps += e.getSteps();
      samples += e.getSamples();
      epochs.push_back({{"epoch", e.getEpoch() + 1},
                        {"samples", e.getSamples()},
                        {"duplicates", e.getDuplicates()},
                        {"missing", e.getMissing()},
                        {"rejected", e.getRejected()},
                        {"test_accuracy", e.getTestAccuracy()},
                        {"seconds", e.getSeconds()},
                        {"from_checkpoint", e.getFromCheckpoint()},
                        {"skipped", e.getSkipped()},
                        {"digest", hex(e.getDigest())}});
    }
    nlohmann::json skippedFiles = nlohmann::json::array();
    for (auto f : r.getSkippedFiles()) skippedFiles.push_back(f.cStr());
    if (!skippedFiles.empty()) {
      printf("\n%zu training samples could not be read and were skipped (--skip-bad-samples):\n",
             skippedFiles.size());
      for (auto& f : skippedFiles) printf("  %s\n", f.get<std::string>().c_str());
    }
    nlohmann::json dataset = nullptr;
    if (s_.source) {
      dataset = {{"path", s_.source->where()},
                 {"kind", s_.source->kind()},
                 {"samples", s_.source->size()},
                 {"classes", s_.classes},
                 {"transform", s_.transform},
                 {"test_dataset", s_.testDataset},
                 {"test_transform", s_.testTransform},
                 {"sample_shape", s_.shape.channelsFirst
                                      ? nlohmann::json::array({s_.shape.channels, s_.shape.height,
                                                               s_.shape.width})
                                      : nlohmann::json::array({s_.shape.height, s_.shape.width,
                                                               s_.shape.channels})},
                 {"dtype", troupe::images::dtypeName(s_.dtype)}};
    }
    auto c = r.getCheckpoints();
    nlohmann::json resumed = nullptr;
    if (c.getResumedFrom().size() > 0) {
      // The counts above include what the interrupted run trained on: the checkpoint carried
      // each sample's count of its epoch, and this run counted its own against them.
      printf("\nresumed from %s: epoch %u continued from sample %lu of %lu\n",
             c.getResumedFrom().cStr(), c.getResumedEpoch() + 1,
             (unsigned long)c.getResumedSamples(), (unsigned long)samples_);
      resumed = {{"checkpoint", c.getResumedFrom().cStr()},
                 {"epoch", c.getResumedEpoch() + 1},
                 {"step", c.getResumedStep()},
                 {"samples_of_epoch", c.getResumedSamples()}};
    }
    if (c.getWritten() > 0) {
      printf("checkpoints written    %u (%.2f s), the newest %s\n", c.getWritten(),
             c.getWriteSeconds(), c.getLast().cStr());
    }
    bool spot = s_.pricing == "spot";
    double pricePerHour = 0;
    std::vector<std::string> unpriced;
    nlohmann::json instances = nlohmann::json::array();
    for (auto& n : job_.nodes()) {
      auto price = s_.prices.perHour(n.instanceType().cStr(), spot);
      pricePerHour += price.value_or(0);
      if (!price) unpriced.push_back(n.instanceType().cStr());
      instances.push_back({{"host", n.host().cStr()},
                           {"group", n.group().cStr()},
                           {"instance_type", n.instanceType().cStr()},
                           {"vcpus", n.vcpus()}});
    }
    double stepMs = steps ? 1000 * seconds / steps : 0;
    double rate = seconds > 0 ? samples / seconds : 0;
    double waitShare = seconds > 0 ? wait / seconds : 0;
    double cost = pricePerHour / 3600 * stepMs / 1000 * 1000;
    printf("\n%-22s %s\n", "mean step", (fmt("%.1f", stepMs) + " ms").c_str());
    printf("%-22s %s\n", "samples/s", fmt("%.0f", rate).c_str());
    printf("%-22s %s\n", "trainer data wait", (fmt("%.1f", 100 * waitShare) + " %").c_str());
    printf("%-22s %s\n", "cluster price",
           ("$" + fmt("%.3f", pricePerHour) + "/h" + (spot ? " (spot)" : "")).c_str());
    for (auto& t : unpriced) {
      printf("%-22s no %s price for %s: counted as $0\n", "", spot ? "spot" : "on-demand",
             t.c_str());
    }
    printf("%-22s %s\n", "cost per 1,000 steps", ("$" + fmt("%.4f", cost)).c_str());
    auto cpu = r.getCpu();
    double perBatch = cpu.getBatches() ? 1000.0 / cpu.getBatches() : 0;
    printf("%-22s %s\n", "trainer CPU per batch",
           (fmt("%.3f", cpu.getLoopSeconds() * perBatch) + " ms receiving, " +
            fmt("%.2f", cpu.getProcessSeconds() * perBatch) + " ms in all")
               .c_str());

    // The sizing advisor's inputs (advise.h), and its recommendation from them.
    nlohmann::json rates = nullptr;
    std::string noAdvice;
    if (steps == 0 || stepSeconds <= 0) {
      noAdvice = "no training steps were measured";
    } else if (st.seconds <= 0 || st.images == 0) {
      noAdvice = "no augmenter answered stats() with augmentation time";
    } else {
      double bytesPerBatch = st.batches ? double(st.bytes) / st.batches : 0;
      // The CPU trainer's compute is its step thread's CPU time: its wall time also holds what
      // augmenters on the same CPUs took from it (no data group). A GPU trainer's is wall time.
      bool onCpu = std::string(r.getDevice().cStr()).find("using CPU") == 0;
      double computeSeconds = onCpu && stepCpuSeconds > 0 ? stepCpuSeconds : stepSeconds;
      // The trainer process's CPU per step once batches flow, without the augmenters that ran
      // in it (no data group): steps, evaluation, receiving.
      auto trainerCpu = r.getCpu();
      double trainerCpuMs = trainerCpu.getBatches()
                                ? 1000 *
                                      std::max(0.0, trainerCpu.getSteadyProcessSeconds() -
                                                        st.secondsBesideTrainer) /
                                      trainerCpu.getBatches()
                                : 0;
      rates = {{"augment_images_per_vcpu_second", st.images / st.seconds},
               {"augmented_images", st.images},
               {"augmenters_answered", st.answered},
               {"augmenters_lost", st.lost},
               {"compute_step_ms", 1000 * computeSeconds / steps},
               {"step_wall_ms", 1000 * stepSeconds / steps},
               {"trainer_cpu_ms_per_step", trainerCpuMs},
               {"fill_ms_per_epoch", epochCount ? 1000 * fill / epochCount : 0},
               {"load_ms_per_augmenter", st.answered ? 1000 * st.loadSeconds / st.answered : 0},
               {"epochs", epochCount},
               {"steps_per_epoch", epochCount ? double(steps) / epochCount : 0},
               {"other_ms_per_step",
                std::max(0.0, 1000 * (seconds - stepSeconds - wait) / steps)},
               {"stream_bytes_per_s", seconds > 0 ? steps * bytesPerBatch / seconds : 0},
               {"bytes_per_batch", bytesPerBatch},
               {"batch_size", s_.batchSize},
               {"trainer_on_cpu", onCpu},
               {"augmenters_per_node", s_.perNode},
               {"augment", s_.augment},
               {"blur", s_.augmentConfig.blurKernel},
               {"cpu_scale", cpuScale()},
               {"dnn_group", s_.dnnGroup},
               {"data_group", s_.dataGroup}};
    }
    nlohmann::json advice = nullptr;
    if (!rates.is_null()) {
      nlohmann::json partial = {{"rates", rates},
                                {"instances", instances},
                                {"mean_step_ms", stepMs},
                                {"data_wait_fraction", waitShare},
                                {"pricing", s_.pricing}};
      try {
        namespace adv = hetero_train::advise;
        auto m = adv::fromReport(partial);
        std::vector<std::string> types = {"ml.c5.xlarge", "ml.c5.2xlarge", "ml.c5.4xlarge",
                                          "ml.c5.9xlarge", "ml.c5.18xlarge"};
        if (!m.dataType.empty() &&
            std::find(types.begin(), types.end(), m.dataType) == types.end() &&
            troupe::sched::findInstanceType(m.dataType)) {
          types.push_back(m.dataType);
        }
        auto a = adv::recommend(m, adv::candidates(types, std::max(4u, m.dataCount)), s_.prices);
        printf("\nsizing advice (troupe advise REPORT.json for other types and counts):\n%s",
               adv::table(a).c_str());
        for (auto& row : a.rows) {
          if (row.candidate.count != 0 || m.dataCount == 0) continue;
          printf("homogeneous (%s alone, augmenting on its own vCPUs) would be %.1f ms/step, "
                 "$%.4f per 1k steps (predicted)\n",
                 m.dnnType.c_str(), row.stepMs, row.costPer1000);
        }
        advice = adv::toJson(a);
      } catch (const hetero_train::advise::AdviseError& e) {
        noAdvice = e.what();
      }
    }
    if (!noAdvice.empty()) printf("\nno sizing advice: %s\n", noAdvice.c_str());
    auto changes = job_.membershipChanges();
    if (!changes.empty()) {
      printf("\nmembership changes during the job:\n");
      for (auto& m : changes) printf("  %s\n", m.c_str());
    }
    fflush(stdout);
    end_->reported = true;  // the end callback has nothing to add (a report that cannot be
                            // written fails the job, and says so)
    if (!s_.report.empty()) {
      nlohmann::json placements = nlohmann::json::array();
      for (auto& p : placed_) {
        placements.push_back(
            {{"actor", p.actor}, {"type", p.type}, {"host", p.host}, {"group", p.group}});
      }
      nlohmann::json j = {{"placements", placements},
                          {"instances", instances},
                          {"epochs", epochs},
                          {"device", r.getDevice().cStr()},
                          {"mean_step_ms", stepMs},
                          {"samples_per_s", rate},
                          {"data_wait_fraction", waitShare},
                          {"cost_per_1000_steps_usd", cost},
                          {"pricing", s_.pricing},
                          {"cluster_price_per_hour_usd", pricePerHour},
                          {"resumed_from", resumed},
                          {"checkpoints_written", c.getWritten()},
                          {"checkpoint_write_seconds", c.getWriteSeconds()},
                          {"trainer_cpu",
                           {{"batches", cpu.getBatches()},
                            {"copied_batches", cpu.getCopiedBatches()},
                            {"receive_ms_per_batch", cpu.getLoopSeconds() * perBatch},
                            {"process_ms_per_batch", cpu.getProcessSeconds() * perBatch},
                            {"handoffs", cpu.getHandoffs()},
                            {"handoff_us_per_batch",
                             cpu.getHandoffs() ? 1e6 * cpu.getHandoffSeconds() / cpu.getHandoffs()
                                               : 0.0}}},
                          {"rates", rates},
                          {"advice", advice},
                          {"membership", changes},
                          {"dataset", dataset},
                          {"skipped_files", skippedFiles},
                          {"exit_status", 0}};
      hetero_train::writeReport(s_.report, j.dump(2) + "\n");
    }
  }

  // CPUs of this machine per vCPU: troupe sim's CPU budget (TROUPE_CPU_SCALE), else 1 (a real
  // instance's vCPU is one of its CPUs).
  static double cpuScale() {
    const char* text = getenv("TROUPE_CPU_SCALE");
    if (text == nullptr || *text == '\0') return 1;
    char* end = nullptr;
    double scale = strtod(text, &end);
    return *end == '\0' && scale > 0 && scale <= 64 ? scale : 1;
  }

  troupe::Driver& job_;
  Settings s_;
  uint64_t samples_ = 0;
  std::vector<Placed> placed_;
  // What the job's end reports when the job ends before report() (a stop, a failure).
  std::shared_ptr<hetero_train::EndState> end_ = std::make_shared<hetero_train::EndState>();
  std::deque<troupe::Ref<hetero::Augmenter>> augmenters_;  // every one, joined nodes' too
  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      printf("could not place augmenters on a node that joined: %s\n", e.getDescription().cStr());
      fflush(stdout);
    }
  } quiet_;
  kj::TaskSet tasks_{quiet_};
  bool live_ = isatty(STDOUT_FILENO);  // a terminal: one progress line, redrawn
};

}  // namespace

int main(int argc, char* argv[]) {
  // The CPU trainer's OpenMP threads must sleep when idle, or they spin on the cores BLAS and the
  // augmenters need (measured here: 86 ms/step instead of 211). libgomp reads the setting before
  // main() runs, so set it and start again.
  // One OpenMP thread: the model's elementwise work is small, and the setting must reach the pool
  // threads that run the training steps (omp_set_num_threads() would only reach the caller's).
  if (getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("OMP_NUM_THREADS", "1", 0);
    // A stop that came already, or comes during the exec, is pending for the new image
    // (troupe/loop.h).
    troupe::blockStopSignalsForExec();
    execv("/proc/self/exe", argv);
    troupe::holdStopSignals();  // the exec failed: this image goes on
  }
  auto settings = parseSettings(argc, argv);
  troupe::Registry types;
  types.add<troupe::train::AugmenterActor>();  // "train.Augmenter" (train.capnp's Augmenter)
  types.add<troupe::train::TrainerActor>();    // "train.Trainer"
  troupe::RunOptions options;
  options.headGroup = settings.dnnGroup;  // the head fate-shares with the trainer
  return troupe::run(
      argc, argv, types,
      [settings](troupe::Driver& job) mutable {
        auto j = kj::heap<Job>(job, settings);
        auto& ref = *j;
        return ref.run().promise().attach(kj::mv(j));
      },
      options);
}
