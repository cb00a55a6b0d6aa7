// File: job.h
//
// The process's troupe job for the Python package (python/src/native.cpp's functions call it), as
// in a C++ app: startJob() runs troupe::run() on a thread of its own with train.Augmenter and
// train.Trainer and a driver that places them as hetero_train does - a trainer per DDP rank, each
// in its script's process with a ScriptLearner (script_learner.h) that hands its batches to the
// script. On a training instance startJob() returns once a trainer attached to this process's
// learner (on the head, once the driver runs too); on a data instance it never returns: the
// process serves augmenters until the job ends, and troupe::run() ends it with the job's exit
// code, as it ends every process.

#pragma once

#include <memory>
#include <string>
#include <vector>

#include "local_ranks.h"
#include "script_learner.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace troupe::python {

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
  bool shuffle = true, dropLast = false;  // a dataset's epoch, cut as torch's DataLoader cuts it
  // troupe.data.DataLoader: the script's own Dataset (`samples` long) in this process's worker
  // processes (workers.h), epochs until the script ends.
  bool python = false;
  bool inOrder = false;  // the batches reach the script in the epoch's order
};

// A dataset's samples as the transform writes them (set by start() before the runtime runs).
struct Format {
  std::shared_ptr<const troupe::data::Source> source;
  troupe::images::Shape shape;
  troupe::images::Dtype dtype = troupe::images::Dtype::kUint8;
  uint32_t classes = 0;
};

// Starts this process's job (see above); throws, naming it, when the dataset or transform cannot
// be used.
void startJob(std::vector<std::string> argv, Settings settings);
std::string jobPlacements();  // the driver's table of where the actors went (the head's; else "")
const Format& jobFormat();
std::shared_ptr<train::ScriptLearner> jobLearner();

// What the module's functions feed the script from: the process's learner (a troupe process), or
// the instance's troupe process's (a local rank's process; local_ranks.h). Throws before either.
Feed& feed();
void setFeed(std::unique_ptr<Feed> feed);

}  // namespace troupe::python
