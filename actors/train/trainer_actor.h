// The trainer actor: hands each epoch's shards out to its augmenters from a queue, one shard at a
// time per augmenter, so that a slow, throttled or newly joined augmenter takes what it can and
// no more; pulls the augmented batches with credit-based flow control (each stream has at most
// `prefetch` batches in flight), hands each to its learner (learner.h: hetero_train's MLP on the
// node's device, CUDA when built with it and a GPU is present, else Thrust's CPU back end; or a
// training script in this process, script_learner.h), and checks that every training sample
// arrives exactly once per epoch. What a batch holds beyond its heading is its kind's
// (batch_source.h), read and checked by the kind's BatchReader. When a stream breaks (its
// augmenter's node was lost or drained), the shard goes back to the queue and the next free
// augmenter resumes it from the last position the trainer acknowledged; the augmenter itself is
// used again once the runtime has restarted it.
//
// With a checkpoint folder it also survives the loss of the whole job (a managed spot reclaim):
// every `checkpointEvery` steps and when it is stopped before training ends (SIGTERM starts
// that cascade) it writes its state between two steps (checkpoint.h), and train() resumes from
// the newest checkpoint of the same job: same model and momentum, same epoch, each shard from its
// acknowledged position, the epoch's exactly-once count continued from the samples the earlier
// run trained on (trainer_checkpoint.cpp).

#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "batch_source.h"
#include "troupe/train/checkpoint.h"
#include "troupe/train/learner.h"
#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/dataset/epoch.h"
#include "troupe/received.h"

namespace troupe::train {

class TrainerActor final : public ActorBase<hetero::Trainer> {
 public:
  explicit TrainerActor(ActorContext& context);
  ~TrainerActor() noexcept(false);

  kj::Promise<void> onStart() override;
  kj::Promise<void> onStop() override;
  // Stopped while training (the job is ending early: SIGTERM, a failure): finishes the step in
  // flight and writes a checkpoint, within the actor's stop deadline.
  kj::Promise<void> train(TrainContext call) override;
  kj::Promise<void> progress(ProgressContext call) override;
  kj::Promise<void> addSources(AddSourcesContext call) override;
  kj::Promise<void> retireSources(RetireSourcesContext call) override;

  // Where augmenters deliver (the BatchSink capability handed to produce()).
  void deliver(hetero::Batch::Reader batch);
  // A later loader's pickled WorkerSpec, which its augmenters fetch once per process.
  capnp::Data::Reader workerSpec() const { return args_.getWorkerSpec(); }
  uint32_t loader() const { return args_.getLoader(); }
  // The script left planned pass `pass` (a break, then its next iter()): what it has not taken
  // is not made; its streams end now and the pass ends, every position it did not train on
  // counted as abandoned.
  void abandonPass(uint32_t pass);

 private:
  friend class ScriptLearner;  // its state(): snapshot() on this thread
  struct Source {
    // A shard of the epoch (shardIndices(samples, shard, shardCount())): the unit of work that
    // one augmenter at a time serves.
    uint32_t shard;
    int32_t augmenter = -1;  // index in augmenters_ serving it now; -1: in the queue
    uint64_t session = 0;
    uint64_t acked = 0;              // every sample before this position was trained on
    uint64_t end = 0;                // shard size, known once produce() resolved
    bool produced = false;           // produce() resolved for this epoch: all of it was pushed
    uint64_t staleLogged = ~0ull;    // the session whose first stale batch was logged
    uint32_t queued = 0;             // batches of its current stream waiting in queue_
    std::vector<uint32_t> expected;  // this epoch's order of the shard
    kj::TimePoint since = kj::origin<kj::TimePoint>();  // when its current stream started
    // A planned pass: the shard's first position in it, and where its batches end (positions
    // in `expected`).
    uint64_t first = 0;
    std::vector<uint32_t> ends;
  };
  struct AugmenterRef {
    ActorAddress address;  // its current incarnation
    hetero::Augmenter::Client client = nullptr;
    uint32_t streams = 0;  // shards it serves now (streamsEach() at most)
    bool down = false;   // its stream broke: used again once it runs as a new incarnation
    bool gone = false;   // will not come back (monitor)
    bool added = false;  // by addSources(): its first batch is logged (bench_membership)
    bool slow = false;   // a shard was taken from it this epoch: it steals none itself
  };
  struct Pending {
    // A batch received: which stream and position of it, the samples it left out, and the step
    // it makes (the ids, and its kind's fields as reader_ read them).
    uint32_t source;
    uint64_t session;
    uint32_t epoch;
    uint64_t begin;
    std::vector<uint32_t> skipped;          // unreadable samples of `step.ids`, left out
    std::vector<std::string> skippedFiles;  // "file: why", one per skipped id
    std::vector<std::string> warned;        // decoded despite libjpeg's warning: "file: warning"
    StepBatch step;
  };
  struct StepInFlight {
    // The batch a training step on the pool is applying. Its samples count as trained from the
    // moment it is offloaded; should the step never run (its job cancelled before it started),
    // a checkpoint takes them back.
    uint32_t source;
    uint64_t begin;
    std::vector<uint32_t> ids;
    std::shared_ptr<std::atomic<bool>> done;  // set on the pool thread once the step applied
    std::vector<uint32_t> skipped;            // of the batch's positions: unreadable, skipped
    std::vector<uint32_t> all;                // every id of the batch, skipped ones too
  };
  // Takes `step` back from `seen` and `stats` (a step that never ran): its samples are trained
  // on after a resume, or by the stream that resends them.
  void untrain(const StepInFlight& step, std::vector<uint8_t>& seen, EpochRecord& stats) const;

  struct CpuTimes {
    // CPU seconds used so far by the calling thread and by the whole process.
    double thread = 0, process = 0;
    static CpuTimes now();
    CpuTimes operator-(const CpuTimes& o) const { return {thread - o.thread, process - o.process}; }
  };

  kj::Promise<void> runEpoch(uint32_t epoch, bool resumed);  // planned: once the plan is here
  kj::Promise<void> runEpochNow(uint32_t epoch, bool resumed);
  kj::Promise<void> runFrom(uint32_t epoch);  // this epoch and every one after it
  static constexpr uint32_t kUnbounded = ~0u;  // epochs_ of a script's DataLoader
  // Sets up `epoch`'s shards and hands them to the augmenters. With `ahead`, while the previous
  // epoch is still being evaluated: its streams start at sample 0 and their batches wait in the
  // queue, so the data group works through the evaluation and the epoch starts without a fill.
  void beginEpoch(uint32_t epoch, bool resumed, bool ahead);
  uint32_t shardCount() const;
  // Shards per epoch: about kBatchesPerShard batches each, whatever the number of augmenters (so
  // a checkpoint resumes with any number of them). With TrainerArgs.order batched, runs of whole
  // batches of the epoch's order (data::BatchedEpoch); else shardIndices, each in its own order.
  uint64_t shardSize(uint32_t shard) const;
  std::vector<uint32_t> shardOrder(uint32_t shard, uint32_t epoch) const;
  kj::Maybe<data::BatchedEpoch> batched_;
  // BatchOrder.planned: each pass's shards come from the learner's plan (a script's sampler),
  // set up as the pass starts (usePlan()); seen_ counts positions, not sample ids.
  bool planned_ = false;
  std::shared_ptr<const PassPlan> plan_;
  void usePlan(std::shared_ptr<const PassPlan> plan);
  uint64_t batchEnd(const Source& s, uint64_t position) const;  // of the batch at `position`
  // The index in seen_ of the k-th sample of a batch at `begin` of source `source`.
  size_t seenIndex(uint32_t source, uint64_t begin, size_t k, uint32_t id) const;
  // Batched: the epoch's whole order, computed once an epoch (a cache: mutable).
  mutable std::shared_ptr<const std::vector<uint32_t>> epochOrder_;
  mutable uint32_t epochOrderOf_ = ~0u;
  static constexpr uint32_t kBatchesPerShard = 8;
  // In order, a shard is one batch: every augmenter makes some of the next batches.
  uint32_t batchesPerShard() const { return inOrder_ ? 1 : kBatchesPerShard; }
  // Memory bounded by construction, in order or not (torch's rule): at most prefetch_ batches per
  // augmenter are in the making or waiting in queue_. A stream holds min(prefetch_, its
  // batches) of them (credits), less those of it already queued; queued batches hold one each.
  // A stream is started only while the total stays within budget(), except the epoch's next
  // unfinished shard, which always may start (in order, the trainer waits for it).
  // And, in bytes, a quarter of the memory available at the start (batchMemoryBudget()): with
  // batches of ImageNet in float32 (154 MB at 256) and 128 augmenters the rule alone is 39 GB.
  uint64_t budget() const;
  static uint64_t batchMemoryBudget();
  uint64_t memoryBudget_ = ~0ull;
  uint64_t batchBytes_ = 0;  // a batch's bytes: the dataset's format, else the largest received
  bool memoryBoundSaid_ = false;
  static constexpr uint64_t kBeforeTheFirstBatch = 16;
  uint64_t streamCost(const Source& s) const;
  // Streams an augmenter serves at once: in order, a script's one-batch shards, prefetch_ of
  // them (its workers have prefetch_factor batches in the making each, as torch's); else one.
  uint32_t streamsEach() const;
  void addAugmenter(const ActorAddress& address);
  void dispatch();
  // Hands queued shards to free augmenters, in shard order; once the queue is empty, a free
  // augmenter takes over a shard that has been served far longer than shards take (steal()).
  bool steal(uint32_t augmenter);
  // The epoch's tail: the shard in progress with the most left (in order: the shard the trainer
  // waits for), if its stream has run past kSlowShardFactor times the median shard's time (and
  // at least a second), moves to `augmenter` from its acknowledged position. Its old augmenter (a slow node: a throttled link, a
  // saturated CPU) keeps its other work but steals nothing this epoch.
  static constexpr double kSlowShardFactor = 4;
  static constexpr kj::Duration kLookAgain = 500 * kj::MILLISECONDS;  // dispatch() while waiting
  void startSource(uint32_t index);
  // Where a stream for `s` starts: its acknowledged position, or 0 for an epoch begun ahead.
  uint64_t from(const Source& s) const;
  void streamBroke(uint32_t index, uint32_t augmenter, kj::Exception error);
  // The shard goes back to the queue (from `acked`); its augmenter is down until revive() sees it
  // run as a new incarnation.
  void unassign(uint32_t index);
  kj::Promise<void> revive(uint32_t augmenter);
  void gone(uint64_t actorId, const Exit& why);
  // An augmenter will not come back (its node is lost and there was no room to restart it, or it
  // reached its restart limit): the others take the queue, so a lost data instance costs
  // throughput, never samples.
  kj::Promise<void> consume(uint32_t epoch);
  // BatchOrder.inOrder: the queue's index of the epoch's next batch (or of a stale one), none
  // while it is still being made.
  kj::Maybe<size_t> nextInOrder(uint32_t epoch) const;
  bool inOrder_ = false;
  kj::Promise<void> dataReady();
  void wake();
  bool epochDone() const;
  void grant(Source& s, uint32_t credits);
  // What is wrong with `b` as the next batch of `s`, or nothing: its heading and ids here, its
  // kind's fields by reader_.
  kj::Maybe<kj::String> validate(const Pending& b, const Source& s) const;
  std::set<std::string> skippedFiles_;          // every file skipped, once
  std::set<std::string> warnedFiles_;           // every file decoded despite a warning, once

  // -- checkpoints (trainer_checkpoint.cpp) --
  JobIdentity identity() const;
  kj::Promise<void> restore();
  // Before the first epoch: resumes from the newest checkpoint of this job, if any (or sets them
  // all aside with `fresh`). Fails train() when it cannot be used here.
  void apply(const LoadedCheckpoint& loaded);
  // Moves the shards to the checkpoint's positions. Throws CheckpointError when it does not fit
  // this job (restore() turns that into the trainer's failure).
  kj::Promise<void> checkpoint(std::string why);
  // Writes the state as it is between two steps (the caller makes sure no step runs). A failed
  // write is logged and training goes on: the previous checkpoint stays the newest.
  TrainingState snapshot();
  // Everything but the model, which the pool job adds. A step in flight that the learner does
  // not have yet (StepBatch::done) is left out: its batch is sent again after a resume.
  void takeBackUnappliedStep();
  bool due() const;
  // Whether the step just finished is one at which a periodic checkpoint is written.
  hetero::TrainerArgs::Reader args_;
  uint32_t batchSize_, prefetch_;
  uint64_t seed_;
  // The model side (learner.h): hetero_train's MLP, or a training script in this process.
  std::shared_ptr<Learner> learner_;
  // The data side's kind of batch (batch_source.h), as TrainerArgs names it.
  std::unique_ptr<BatchReader> reader_;

  std::vector<Source> sources_;           // the epoch's shards
  std::vector<AugmenterRef> augmenters_;  // train()'s, then addSources()'s
  std::vector<double> shardSeconds_;      // the latest shards' streams, start to last push
  static constexpr size_t kShardTimesKept = 512;
  kj::Maybe<kj::Exception> fatal_;        // fails train(): no augmenter is left
  uint64_t trainSamples_ = 0;
  uint32_t epoch_ = 0, epochs_ = 0;
  uint64_t nextSession_ = 1;
  std::deque<Pending> queue_;
  std::vector<uint8_t> seen_;
  EpochRecord stats_;
  std::vector<EpochRecord> history_;
  uint64_t totalSteps_ = 0, plannedSteps_ = 0;
  double totalWait_ = 0;
  kj::TimePoint started_ = kj::origin<kj::TimePoint>();
  kj::TimePoint epochStarted_ = kj::origin<kj::TimePoint>();
  double epochSecondsBefore_ = 0;  // of the resumed epoch, spent by the earlier run
  double waitBefore_ = 0;          // of the resumed epoch's waitSeconds, the earlier run's

  std::shared_ptr<CheckpointDir> checkpoints_;  // null: no checkpoint folder
  uint32_t checkpointEvery_ = 0, killDuringCheckpoint_ = 0;
  bool fresh_ = false;
  uint64_t samplesSetting_ = 0;
  bool training_ = false;  // train() started and has not ended
  // beginEpoch(ahead): the epoch whose streams started before its predecessor's evaluation ended;
  // until then `acked` still holds the predecessor's positions (what a checkpoint records), so
  // streams start at 0 and dispatch() does not take a full `acked` for a finished shard.
  kj::Maybe<uint32_t> aheadEpoch_;
  bool stopping_ = false;        // onStop(): no new step, evaluation or checkpoint starts
  uint64_t savedSteps_ = ~0ull;  // totalSteps_ of the newest checkpoint (none yet)
  kj::Maybe<StepInFlight> stepInFlight_;
  uint32_t firstEpoch_ = 0;
  uint64_t resumedSteps_ = 0, resumedSamples_ = 0;
  std::string resumedFrom_, lastWritten_;
  uint32_t written_ = 0;
  uint32_t failedInARow_ = 0;  // checkpoints not written since the last one that was
  static constexpr uint32_t kCheckpointFailuresInARow = 2;  // then the job fails
  CpuTimes cpuAtStart_;  // when train() began, on its (the event loop's) thread
  // Process CPU from each epoch's first batch to its end: `steadyFrom_` is set while counting.
  kj::Maybe<double> steadyFrom_;
  double steadyProcessSeconds_ = 0;
  uint64_t stepsAtStart_ = 0;
  uint64_t copiedBatches_ = 0;    // deliveries Received::keep had to copy
  bool waitedSinceStep_ = false;  // consume() waited for data since the last step (Handoffs)
  double writeSeconds_ = 0;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiter_;
  std::shared_ptr<TrainerActor*> self_;  // what sinks hold: cleared when the trainer goes
  kj::Own<kj::TaskSet> tasks_;
  // onStart() (the learner's device, its test set) has finished. The runtime delivers calls
  // before that; train() waits for it: a resumed epoch that was already complete evaluates at
  // once, and did so on a test set not loaded yet (a segfault, make test-image's stop case).
  kj::Own<kj::PromiseFulfiller<void>> onStartedFulfiller_;
  kj::ForkedPromise<void> onStarted_ = nullptr;
};

// The learner of a trainer that serves no training script: hetero_train's C++ model
// (mlp_learner.cpp, with the trainer's BLAS and Thrust). Set by addActorTypes() and addTrainer()
// (actors.cpp); a program that registers the trainer for scripts alone (addScriptActorTypes(),
// the Python module) links neither the model nor its libraries (37.6 MB of OpenBLAS in the wheel).
using ModelLearnerFactory = std::shared_ptr<Learner> (*)(hetero::TrainerArgs::Reader args);
extern ModelLearnerFactory modelLearnerFactory;

}  // namespace troupe::train
