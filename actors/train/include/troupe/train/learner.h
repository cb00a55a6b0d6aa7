// File: learner.h
//
// What the trainer actor trains. The trainer (trainer_actor.h) owns the data side: the epoch's
// shards, the streams and their credits, the exactly-once count, recovery and checkpoints of the
// positions. A Learner owns the model side: one step per batch, the evaluation after each epoch,
// the model's part of a checkpoint. Two exist:
//   - MlpLearner (mlp_learner.h): hetero_train's MLP on the node's device, stepped on the pool;
//   - ScriptLearner (script_learner.h): a training script in the trainer's own process (the
//     Python package troupe.data), handed each batch and done with it when it asks for the next.

#pragma once

#include <atomic>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kj/async.h>

#include "troupe/train/batch_maker.h"
#include "troupe/train/checkpoint.h"
#include "troupe/actor.h"
#include "troupe/received.h"

namespace troupe::train {

class TrainerActor;

struct StepBatch {
  uint32_t epoch = 0;
  std::vector<uint32_t> ids;
  std::vector<uint8_t> labels;
  // The received message's bytes, not a copy: ids.size() x 784 float32 (normalised) or, with
  // `bytes`, uint8 pixels (x 255) not yet normalised. With a dataset (TrainerArgs.sample): each
  // sample as SampleFormat says, in `dtype`, and its class in `targets` (labels too where every
  // class fits a byte).
  Received images;
  bool bytes = false;
  uint8_t dtype = 0;  // troupe::images::Dtype, with a dataset
  std::vector<int64_t> targets;
  // A script's Dataset (TrainerArgs.python): its collated tensors in `images`, and how they nest.
  std::vector<MadeTensor> tensors;
  std::string structure;
  float learningRate = 0;  // the trainer's schedule (the MLP follows it; a script has its own)
  // The trainer waited for data since the previous step: the time between the two steps is not
  // the learner's handoff (Handoffs).
  bool waited = false;
  // Set once the learner has the batch for good: the MLP applied it, the script received it.
  // Until then a checkpoint leaves the batch out (it is sent again after a resume).
  std::shared_ptr<std::atomic<bool>> done;
};

struct Handoffs {
  // From one step's end to the next one's start, where the batch was already in the trainer's
  // queue: what the learner's side costs per batch beyond the step (the MLP: the pool job's end
  // reaching the event loop, the bookkeeping, the next pool job starting; a script: from asking
  // for the next batch to holding it as tensors). docs/benchmarks.md, "troupe.data".
  uint64_t count = 0;
  double seconds = 0;
};

struct StepResult {
  float loss = NAN;       // NaN where the learner does not say (a script)
  double cpuSeconds = 0;  // CPU time of the step's thread (0 where not measured)
  bool abandoned = false;  // the script left the batch's epoch before it took the batch
};

class Learner {
 public:
  virtual ~Learner() noexcept(false) = default;  // (kj::Own members may throw)

  // The trainer that steps it, from its start to its destructor (on the trainer's thread).
  virtual void attach(TrainerActor& trainer) { (void)trainer; }
  virtual void detach() {}
  // Before train(): the device, the test set. `context` is the trainer's.
  virtual kj::Promise<void> start(ActorContext& context) = 0;
  // The report's `device`: where and how it trains.
  virtual std::string device() const = 0;
  // JobIdentity::layerSizes: the model's shape (empty where the model is not troupe's).
  virtual std::vector<int> shape() const = 0;

  // One step. The trainer takes the next batch once the promise resolves.
  virtual kj::Promise<StepResult> step(ActorContext& context, StepBatch batch) = 0;
  // After the epoch's last step: the test accuracy, or NaN where the learner evaluates on its
  // own (a script).
  virtual kj::Promise<double> evaluate(ActorContext& context, uint32_t epoch) = 0;
  // What handing batches over has cost so far.
  virtual Handoffs handoffs() const = 0;
  // The epoch is recorded (its report is in the history, a state now holds the next one).
  virtual void epochEnded(uint32_t epoch) { (void)epoch; }

  // A state to resume from that did not come from the checkpoint folder (a script's
  // load_state_dict()); the trainer checks it as it checks a checkpoint file.
  virtual std::optional<LoadedCheckpoint> givenState() { return std::nullopt; }
  // The model's part of a checkpoint, on the pool: load() takes it from `state` (and clears it
  // there), save() puts it in. Throws CheckpointError when it does not fit the model.
  virtual void load(TrainingState& state, const std::string& name) { (void)state, (void)name; }
  virtual void save(TrainingState& state) { (void)state; }

  // train() ended (history: every epoch's record).
  virtual void finished(const std::vector<EpochRecord>& history) { (void)history; }
  virtual void failed(const kj::Exception& e) { (void)e; }
  // The trainer is stopping: resolves once the learner's side is done with it (a script saved
  // its state and ended). The trainer's stop deadline bounds it.
  virtual kj::Promise<void> stopping() { return kj::READY_NOW; }
  // Whether the trainer goes on handing batches over once stopping() was called (a DDP rank's
  // script: the ranks agree on the step they stop at, which some may still have to reach).
  virtual bool stepsWhileStopping() const { return false; }
  // Resolves when the model's side is done before the epochs are (a training script that ended;
  // rejects with its failure): train() then ends with what was trained. Never, for a model that
  // trains every epoch given.
  virtual kj::Promise<void> ended() { return kj::NEVER_DONE; }
  // Resolves when the model's side may start: train() waits for it before reading givenState()
  // (a script's first iter(), after any load_state_dict()).
  virtual kj::Promise<void> ready() { return kj::READY_NOW; }
  // A planned order (BatchOrder.planned): pass `pass`'s plan, once the learner has it (a script's
  // iter() made it from its sampler). Never for a learner that plans nothing.
  virtual kj::Promise<std::shared_ptr<const PassPlan>> plan(uint32_t pass) {
    (void)pass;
    return kj::NEVER_DONE;
  }
};

}  // namespace troupe::train
