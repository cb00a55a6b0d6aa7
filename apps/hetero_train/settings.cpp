// hetero_train's settings (settings.h).

#include "settings.h"

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
#include "troupe/train/spawn.h"
#include "troupe/train/shared_source.h"
#include "troupe/train/checkpoint.h"
#include "end_report.h"
#include "advise.h"
#include "prices.h"
#include "troupe/trainer/mlp.h"
#include "troupe/cli11.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"
#include "troupe/sagemaker.h"
#include "troupe/sched/instance_types.h"
#include "troupe/troupe.h"

namespace hetero_train {

// ImageNet's training recipe (torchvision's references): the default transform for images.
constexpr const char* kImageTransform =
    "RandomResizedCrop(224),RandomHorizontalFlip(),Normalize(imagenet)";

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

namespace {

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

}  // namespace

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
  cli.add_option("--max-image-pixels", s.maxImagePixels,
                 "an image whose header claims more pixels is a bad sample, refused before it "
                 "is decoded (a decompression bomb); default PIL's limit, 0: none");
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


}  // namespace hetero_train
