// File: script_job.h
//
// A training script's troupe job: the Python package's (python/src/native.cpp's functions call
// it), in C++ behind actors/train's face as any app's job is. A script's streams - each troupe.data.DataLoader it makes, or its one
// AugmentedBatches - are numbered in the order it makes them. The first starts the job:
// startJob() runs troupe::run() on a thread of its own with train.Augmenter and train.Trainer and
// a driver that places the stream's augmenters and a trainer per DDP rank, each in its script's
// process with a ScriptLearner (script_learner.h) that hands its batches to the script. On a
// training instance startJob() returns once a trainer attached to this process's learner (on the
// head, once the driver runs too); on a data instance it never returns: the process serves
// augmenters until the job ends, and troupe::run() ends it with the job's exit code, as it ends
// every process. Each later stream (addStream()) gets augmenters and trainers of its own, placed
// by the head's driver when the head's script makes it; its workers' spec reaches the data
// instances pickled (WorkerArgs.pickled), since their scripts never get that far.

#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/train/local_ranks.h"
#include "troupe/train/script_learner.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace troupe::train {

struct Settings {
  unsigned epochs = 5;
  unsigned batchSize = 128;
  unsigned prefetch = 4;
  uint64_t seed = 42;
  uint64_t samples = 0;  // 0: the whole training set
  std::string augment = "heavy";
  int blur = -1;         // -1: the preset's
  unsigned perNode = 0;  // augmenters per data node; 0: one per vCPU
  unsigned restarts = 3;
  unsigned stopTimeoutSeconds = 30;
  std::string dataDir = troupe::data::kDefaultFashionMnistDir;
  std::string dataGroup = "data_group";
  // A dataset of any kind and its transform (docs/data.md); empty: Fashion-MNIST from dataDir.
  std::string dataset, transform;
  bool skipBadSamples = false;
  uint64_t maxImagePixels = troupe::images::kMaxImagePixels;  // 0: no limit
  // A translated torchvision ImageFolder (python/troupe/_translate.py): `dataset` read as class
  // folders whatever lies beside them; JPEGs decoded at full size unless the script asked for
  // DCT scaling (AugmenterArgs.imageFolder, .decodeScaling).
  bool imageFolder = false, decodeScaling = true;
  bool shuffle = true, dropLast = false;  // a dataset's epoch, cut as torch's DataLoader cuts it
  // troupe.data.DataLoader: the script's own Dataset (`samples` long) in worker processes
  // (worker_pool.h), or an ImageDataset; passes until the script ends, each planned by the
  // script (its sampler), with `workers` worker processes per node (0: its CPUs), each
  // `prefetchFactor` batches in the making, `sharedMemory` bytes each.
  bool python = false;
  bool planned = false;
  bool inOrder = false;  // the batches reach the script in the pass's order
  unsigned workers = 0, prefetchFactor = 2;
  uint64_t sharedMemory = 1ull << 30;
  std::string pickled;  // a stream after the first: its workers' spec (python/troupe/_workers.py)
  bool hasImageSeed = false;  // ImageDataset(seed=): its pixels' seed (BatchOrder.imageSeed)
  uint64_t imageSeed = 0;
};

// A dataset's samples as the transform writes them (set before the stream's actors run).
struct Format {
  std::shared_ptr<const troupe::data::Source> source;
  troupe::images::Shape shape;
  troupe::images::Dtype dtype = troupe::images::Dtype::kUint8;
  uint32_t classes = 0;
};

// The learner id of stream `stream`'s rank `localRank` on an instance: what its trainer's
// TrainerArgs.script names, in the instance's troupe process.
uint64_t learnerId(uint32_t stream, uint32_t localRank);

// Starts this process's job with its first stream (see above); throws, naming it, when the
// dataset or transform cannot be used.
void startJob(std::vector<std::string> argv, Settings settings);
// A later stream of this process (a troupe process where the job started): returns its number.
// On the head its actors are placed now; elsewhere its trainer comes when the head's script makes
// the same stream.
uint32_t addStream(Settings settings);
std::string jobPlacements();  // the driver's table of where the actors went (the head's; else "")
const Format& streamFormat(uint32_t stream);
uint32_t streamCount();

// What the module's functions feed stream `stream` from: the process's learner (a troupe
// process), or the instance's troupe process's (a local rank's process; local_ranks.h). Throws
// before either.
Feed& feed(uint32_t stream = 0);
void setFeed(uint32_t stream, std::unique_ptr<Feed> feed);

}  // namespace troupe::train
