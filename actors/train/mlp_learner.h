// File: mlp_learner.h
//
// hetero_train's learner (learner.h): the MLP (troupe/trainer/mlp.h) on the node's device, CUDA
// when built with it and a GPU is present, else Thrust's CPU back end. Each step runs on the
// node's pool; the evaluation is on the Fashion-MNIST test set, or with a dataset
// (TrainerArgs.sample) on its test dataset decoded once through the test transform (none: no
// accuracy). The input layer takes a sample's values as the transform writes them, the output
// layer one unit per class.

#pragma once

#include <chrono>
#include <mutex>

#include "troupe/train/learner.h"
#include "train.capnp.h"
#include "troupe/trainer/mlp.h"

namespace troupe::train {

class MlpLearner final : public Learner {
 public:
  explicit MlpLearner(hetero::TrainerArgs::Reader args);

  kj::Promise<void> start(ActorContext& context) override;
  std::string device() const override { return deviceReason_; }
  std::vector<int> shape() const override;
  kj::Promise<StepResult> step(ActorContext& context, StepBatch batch) override;
  kj::Promise<double> evaluate(ActorContext& context, uint32_t epoch) override;
  void load(TrainingState& state, const std::string& name) override;
  void save(TrainingState& state) override;
  void finished(const std::vector<EpochRecord>& history) override;
  Handoffs handoffs() const override;

 private:
  struct Test {
    std::vector<float> images;
    std::vector<uint8_t> labels;
  };
  trainer::MlpConfig config_;
  std::string deviceName_, dataDir_, modelDir_;
  bool dataset_ = false;  // TrainerArgs.sample: a dataset's samples, not Fashion-MNIST's
  uint8_t dtype_ = 0;
  std::string testDataset_, testTransform_;
  std::string deviceReason_;
  std::shared_ptr<trainer::Mlp> model_;
  std::shared_ptr<const Test> test_;
  struct Gaps {
    // Written on the pool thread of each step, read on the event loop.
    std::mutex mutex;
    std::chrono::steady_clock::time_point lastEnd{};
    Handoffs total;
  };
  std::shared_ptr<Gaps> gaps_ = std::make_shared<Gaps>();
};

// A MlpLearner for `args`: the trainer's modelLearnerFactory (trainer_actor.h) in a program that
// registers the C++ model (actors.cpp).
std::shared_ptr<Learner> makeMlpLearner(hetero::TrainerArgs::Reader args);

}  // namespace troupe::train
