// File: spawn.h
//
// How a driver places the job's actors: hetero_train's driver and a script's (script_job.cpp)
// share it, so that each spawns an augmenter and a trainer one way.
// - Augmenters: one per vCPU of each data node (or `perNode`), preferring the data group;
//   unlinked (one gone for good costs throughput, the trainer gives its shards to the others);
//   restarted up to `restarts` times a minute. A data node that joins the running job gets
//   augmenters of its own, which the trainer's addSources() takes at once.
// - Trainers: what every trainer is told (TrainerSpec: the batches it takes and their order),
//   whichever learner it feeds; the driver adds its learner's own arguments and the placement
//   (the MLP's on the dnn group, a script's rank on its instance). train() is sent the same way.

#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train.capnp.h"
#include "troupe/augment/augment.h"
#include "troupe/driver.h"
#include "troupe/images/transforms.h"

namespace troupe::train {

struct AugmenterSpec {
  uint64_t seed = 42;
  uint32_t batchSize = 128;
  std::string dataDir;
  uint64_t samples = 0;  // the samples per epoch (the dataset's first N)
  troupe::augment::AugmentConfig augment;
  unsigned restarts = 3;
  unsigned perNode = 0;  // augmenters per data node; 0: one per vCPU
  std::string dataGroup = "data_group";
  // A dataset of any kind and its transform spec (AugmenterArgs.dataset); empty: Fashion-MNIST
  // from dataDir through `augment`.
  std::string dataset, transform;
  bool skipBadSamples = false;
  uint64_t maxImagePixels = images::kMaxImagePixels;
  // AugmenterArgs.imageFolder and .decodeScaling.
  bool imageFolder = false, decodeScaling = true;
  // The epoch cut as torch's DataLoader cuts it (AugmenterArgs.order; needs a dataset).
  bool batched = false, shuffle = true, dropLast = false;
  bool python = false;  // a script's Dataset, from the process's batch maker (batch_maker.h)
  // troupe.data.DataLoader: each pass planned by the script (BatchOrder.planned), its workers on
  // each node (AugmenterArgs.workers), an ImageDataset's own seed (BatchOrder.imageSeed).
  bool planned = false;
  // The CPUs an augmenter reserves (1: one per vCPU); a DataLoader's reserve none (0): its
  // worker processes use the CPUs, the augmenters only hand them batches.
  double cpus = 1;
  uint32_t loader = 0, workers = 0, prefetchFactor = 2;
  uint64_t sharedMemoryBytes = 1ull << 30;
  std::string pickled;
  std::optional<uint64_t> imageSeed;
};

// An AugmenterSpec from an app's settings: any type with the fields of the same names (seed,
// batchSize, dataDir, restarts, perNode, dataGroup, dataset, transform, skipBadSamples,
// maxImagePixels, dropLast),
// as hetero_train's and the Python package's settings have; what is the app's own it sets after.
template <typename Settings>
AugmenterSpec augmenterSpecOf(const Settings& s, uint64_t samples, augment::AugmentConfig augment,
                              bool batched) {
  AugmenterSpec spec;
  spec.seed = s.seed;
  spec.batchSize = s.batchSize;
  spec.dataDir = s.dataDir;
  spec.samples = samples;
  spec.augment = augment;
  spec.restarts = s.restarts;
  spec.perNode = s.perNode;
  spec.dataGroup = s.dataGroup;
  spec.dataset = s.dataset;
  spec.transform = s.transform;
  spec.skipBadSamples = s.skipBadSamples;
  spec.maxImagePixels = s.maxImagePixels;
  spec.batched = batched;
  spec.dropLast = s.dropLast;
  return spec;
}

Placement augmenterPlacement(const AugmenterSpec& spec);
SpawnOptions augmenterOptions(const AugmenterSpec& spec, std::string name);

// A dataset's sample as the transform writes it (TrainerArgs.sample).
struct SampleSpec {
  images::Shape shape;
  images::Dtype dtype = images::Dtype::kUint8;
  uint32_t classes = 0;
};

// What every trainer is told, whichever learner it feeds (TrainerArgs).
struct TrainerSpec {
  std::string name = "trainer";
  uint32_t batchSize = 128;
  uint64_t seed = 42;
  uint32_t prefetch = 4;        // batches in flight per augmenter
  uint64_t samplesSetting = 0;  // the samples setting as given (0: all), part of the job's identity
  std::optional<SampleSpec> sample;  // a dataset's samples; unset: Fashion-MNIST's, or `python`
  bool python = false;               // a script's tensors (AugmenterSpec.python)
  std::string workerSpec;            // a later loader's pickled WorkerSpec, served to augmenters
  // The epoch cut as torch's DataLoader cuts it (TrainerArgs.order): this rank's share of
  // `ranks`, each pass planned by the script when `planned`.
  bool batched = false, shuffle = true, dropLast = false, inOrder = false, planned = false;
  uint32_t rank = 0, ranks = 1;
  // Stopped early (SIGTERM), how long it may take: the MLP's step and checkpoint, or the script
  // saving its state.
  kj::Duration stopTimeout = 30 * kj::SECONDS;
  bool quiet = false;  // its start logged at debug level (SpawnOptions::quiet)
};

// The trainer's options from `spec`; `own` (optional) then sets what is its learner's own: the
// MLP's learning rate and checkpoints, a script's learner id and DDP rank.
using TrainerArgsFill = std::function<void(hetero::TrainerArgs::Builder)>;
SpawnOptions trainerOptions(const TrainerSpec& spec, TrainerArgsFill own = nullptr);

// `trainer`'s train() request: `epochs` epochs (0: until its script ends) of `samples` samples,
// from `augmenters`.
capnp::Request<hetero::Trainer::TrainParams, hetero::Trainer::TrainResults> trainRequest(
    Ref<hetero::Trainer>& trainer, uint32_t epochs, uint64_t samples,
    kj::ArrayPtr<Ref<hetero::Augmenter>> augmenters);

// A list of the trainers `trainers` refers to (a Ref copies only from a non-const Ref).
inline std::vector<Ref<hetero::Trainer>> trainerList(kj::ArrayPtr<Ref<hetero::Trainer>> trainers) {
  std::vector<Ref<hetero::Trainer>> out;
  for (auto& t : trainers) out.emplace_back(t);
  return out;
}

// On every data node that joins the running job: spawns its augmenters and adds them to every
// trainer (addSources; one per DDP rank). Then the augmenters of `augmenters` (and of earlier
// joins) that run outside the data group - restarted there when a data node was lost - are retired
// from every trainer and stopped: the trainer's instance's CPUs are the trainer's. `added`
// (optional) hears of each batch of them, for the app's own tables. The tasks live in `tasks`.
using AugmentersAdded =
    std::function<void(const std::string& host, kj::ArrayPtr<Ref<hetero::Augmenter>> added)>;
void growOnJoin(Driver& job, const AugmenterSpec& spec, std::vector<Ref<hetero::Trainer>> trainers,
                kj::ArrayPtr<Ref<hetero::Augmenter>> augmenters, kj::TaskSet& tasks,
                AugmentersAdded added = nullptr);

}  // namespace troupe::train
