// File: script_learner.h
//
// The learner (learner.h) of a training script that runs in the trainer's own process: the
// Python package troupe.data, whose PyTorch loop is the model side. The trainer actor still owns
// the data side (shards, credits, exactly-once, recovery); each batch it would have stepped is
// handed to the script instead, and the step is done when the script asks for the next one.
//
// Two threads meet here: the trainer's (its node's event loop) and the script's (Python's main
// thread, which blocks in next() without the GIL). The trainer pushes items (a batch, an epoch's
// end, the end of training, a stop, a failure) into a queue the script pops; the script answers
// through cross-thread fulfillers (a step done, the script ended) and, for state(), by running
// the trainer's snapshot on the trainer's thread (kj::Executor).
//
// When a batch counts as trained: once the script has received it and then asked for the next
// item or for state() (between two of its steps). A state taken while a batch waits in the queue
// leaves that batch out; it is sent again after a resume.

#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "troupe/train/learner.h"

namespace troupe::train {

class TrainerActor;

class ScriptLearner final : public Learner {
 public:
  // -- the script's side (its own thread) --
  static std::shared_ptr<ScriptLearner> create();  // findable by id() in this process
  static std::shared_ptr<ScriptLearner> find(uint64_t id);
  // The learner of a local rank this process serves to another process (local_ranks.h): made by
  // whichever comes first, its trainer or the server.
  static std::shared_ptr<ScriptLearner> findOrCreate(uint64_t id);
  // end(failure) on every learner of this process whose id `which` picks (a script's end reaches
  // the streams it never made too: their trainers wait on them).
  static void endEvery(const std::function<bool(uint64_t)>& which, const std::string& failure);
  uint64_t id() const { return id_; }

  struct Item {
    enum Kind { kBatch, kEpochEnd, kFinished, kStopped, kFailed };
    Kind kind = kBatch;
    StepBatch batch;     // kBatch
    uint32_t epoch = 0;  // kBatch, kEpochEnd
    std::string text;    // kFinished: the report (JSON); kFailed: why
    bool timedOut = false;  // kFailed: next(timeout) waited that long
  };
  // Blocks until the next item, or for at most `timeout` seconds when it is above 0 (then a
  // kFailed item says so, as torch's DataLoader(timeout=) raises). The batch the script received
  // before counts as trained.
  Item next(double timeout = 0);
  // Blocks until there is a next item, as next() does, and says its kind without taking it, and
  // whether the job is stopping (a kStopped item waits in the queue, maybe behind batches): the
  // DDP ranks' scripts agree on the step they stop at before any takes its next batch
  // (troupe.data's DataLoader). The batch the script received before counts as trained.
  // With `timeout` above 0, waits at most that long: then timedOut says so.
  struct Peeked {
    Item::Kind kind;
    bool stopping;
    bool timedOut = false;
  };
  Peeked peek(double timeout = 0);
  // The trainer's state (checkpoint.h's bytes, without a model), between two of the script's
  // steps: the batch it received last counts as trained. Blocks; throws std::runtime_error when
  // the trainer is not running.
  std::string state();
  // Before training starts: resume from `bytes` (what state() returned in an earlier run); says
  // the epoch (pass) it continues (0-based) and, of a planned pass begun, its label: the script
  // then makes no plan for it. Throws CheckpointError when they are not a state.
  struct Resumed {
    uint32_t pass = 0;
    bool planned = false;  // the state holds the pass's plan
    uint32_t label = 0;
  };
  Resumed resumeFrom(const std::string& bytes, const std::string& name);
  // The script may start: train() goes ahead (streams start, a given state is applied).
  void begin();
  // The script's iter() planned pass `pass` (BatchOrder.planned): its sampler's batches and
  // base seed. The trainer starts the pass with it (plan()).
  void beginPass(uint32_t pass, PassPlan plan);
  // The script left `epoch` before its end (a break, then the next iter()): its batches not yet
  // handed over, and those still to come, are abandoned (StepResult::abandoned), never handed to
  // the script; next() skips to the epoch's end. The batch it holds counts as trained.
  void abandon(uint32_t epoch);
  // The script is done with the stream: `failure` empty when it ended well, else why it failed.
  // `died`: its process ended without ending it (local_ranks.h), a failure that is no other
  // rank's consequence.
  void end(std::string failure, bool died = false);
  // next() returned a batch the trainer had queued, and the script held it as tensors `seconds`
  // after asking (Handoffs).
  void handedOver(double seconds);
  bool ended() const;

  // -- the trainer's side (its event loop) --
  void attach(TrainerActor& trainer) override;
  void detach() override;
  // Resolves once the script called begin().
  kj::Promise<void> begun();
  // Resolves once the script ended: with its failure, if any.
  kj::Promise<std::string> whenEnded();

  kj::Promise<void> start(ActorContext& context) override;
  std::string device() const override { return "the training script (troupe.data)"; }
  std::vector<int> shape() const override { return {}; }
  kj::Promise<StepResult> step(ActorContext& context, StepBatch batch) override;
  kj::Promise<double> evaluate(ActorContext& context, uint32_t epoch) override;
  void epochEnded(uint32_t epoch) override;
  std::optional<LoadedCheckpoint> givenState() override;
  void finished(const std::vector<EpochRecord>& history) override;
  void failed(const kj::Exception& e) override;
  kj::Promise<void> stopping() override;
  bool stepsWhileStopping() const override;
  kj::Promise<void> ended() override;
  kj::Promise<void> ready() override { return begun(); }
  kj::Promise<std::shared_ptr<const PassPlan>> plan(uint32_t pass) override;

  // Which rank of a DDP job the script is (the trainer's TrainerArgs.ddp and order), once a
  // trainer attached: what torchrun would have put in its environment.
  struct Rank {
    uint32_t rank = 0, ranks = 1, localRank = 0, localRanks = 1;
    std::string masterAddr;
    uint16_t masterPort = 0;
    uint64_t seed = 0;  // the job's (Ddp.seed)
  };
  // Blocks until a trainer attached to this learner (this process trains), then says its rank.
  Rank waitAttached();
  Handoffs handoffs() const override;

 private:
  void push(Item item);
  // next() and peek(): the batch held before is trained; then waits for an item (holds mutex_),
  // for at most `timeout` seconds when above 0: false when none came.
  bool awaitItemFor(std::unique_lock<std::mutex>& lock, double timeout);
  uint64_t id_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  // stopping() was called: a kStopped item is in the queue (of a DDP rank: none; the script
  // stops at the step the ranks agree on, python/troupe/_cluster.py)
  bool stopping_ = false;
  // The step of the batch the script holds: fulfilled when it asks for the next item.
  kj::Own<kj::CrossThreadPromiseFulfiller<StepResult>> holding_;
  std::deque<kj::Own<kj::CrossThreadPromiseFulfiller<StepResult>>> queuedSteps_;
  kj::Own<const kj::Executor> executor_;  // the trainer's thread
  TrainerActor* trainer_ = nullptr;
  std::optional<LoadedCheckpoint> given_;
  bool begun_ = false;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> begunFulfiller_;
  bool ended_ = false;
  std::string failure_;
  bool died_ = false;
  std::vector<kj::Own<kj::CrossThreadPromiseFulfiller<std::string>>> endWaiters_;
  Handoffs handoffs_;
  std::optional<Rank> rank_;  // set by the first attach()
  std::optional<uint32_t> abandoned_;  // the newest epoch the script left (abandon())
  // Planned passes: the script's plans not yet taken by the trainer, and the trainer's wait.
  std::map<uint32_t, std::shared_ptr<const PassPlan>> plans_;
  uint32_t planWanted_ = 0;
  std::map<uint32_t, std::pair<uint32_t, uint64_t>> passes_;  // pass -> (label, batches)
  kj::Own<kj::CrossThreadPromiseFulfiller<std::shared_ptr<const PassPlan>>> planWaiter_;
};

}  // namespace troupe::train
