// hetero_train's settings: its flags and hyperparameters, parsed and checked on every node before
// anything starts (settings.cpp), and the dataset they name, opened.

#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/train/checkpoint.h"
#include "prices.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace hetero_train {

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
  uint64_t maxImagePixels = troupe::images::kMaxImagePixels;  // 0: no limit
  bool dropLast = false;  // --dataset: each epoch's last, short batch left out
  std::shared_ptr<const troupe::data::Source> source;  // opened at start (sharedSource)
  troupe::images::Shape shape;                         // a sample as the transform writes it
  troupe::images::Dtype dtype = troupe::images::Dtype::kUint8;
  uint32_t classes = 0;
};

troupe::train::JobIdentity jobIdentity(const Settings& s);
// What a checkpoint must share with this job to be resumed by it (checkpoint.h).

Settings parseSettings(int argc, char* argv[]);
// The app's flags and SageMaker's hyperparameters; a bad one is a configuration error (exit 2)
// naming it, on every node at once.

}  // namespace hetero_train
