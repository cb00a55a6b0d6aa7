// The trainer actor (trainer_actor.h): its epochs, the shards' queue, the streams and their
// recovery.

#include "trainer_actor.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cmath>
#include <utility>

#include "troupe/images/transforms.h"
#include "troupe/log.h"

#include "clock.h"
#include "troupe/train/script_learner.h"
#include "troupe/dataset/epoch.h"
#include "troupe/trace.h"

namespace troupe::train {

ModelLearnerFactory modelLearnerFactory = nullptr;

namespace {

class Sink final : public hetero::BatchSink::Server {
  // The trainer's end of the stream. It lives as long as an augmenter holds it, so it must not
  // outlive the trainer's attention: the trainer detaches it when it stops.
 public:
  explicit Sink(std::shared_ptr<TrainerActor*> trainer) : trainer_(kj::mv(trainer)) {}
  kj::Promise<void> push(PushContext call) override {
    if (*trainer_ != nullptr) (*trainer_)->deliver(call.getParams().getBatch());
    return kj::READY_NOW;
  }
  kj::Promise<void> workerSpec(WorkerSpecContext call) override {
    KJ_REQUIRE(*trainer_ != nullptr, "the trainer has ended");
    auto spec = (*trainer_)->workerSpec();
    spdlog::info("DataLoader {}: its workers' spec ({:.1f} MiB) sent to a data instance's process",
                 (*trainer_)->loader(), spec.size() / 1048576.0);
    call.getResults().setPickled(spec);
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<TrainerActor*> trainer_;  // null once the trainer is gone
};

struct Quiet : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("trainer task failed: {}", e.getDescription().cStr());
  }
};
Quiet quiet;

}  // namespace

TrainerActor::TrainerActor(ActorContext& context)
    : ActorBase(context), args_(context.args<hetero::TrainerArgs>()) {
  batchSize_ = args_.getBatchSize();
  prefetch_ = std::max<uint32_t>(1, args_.getPrefetch());
  seed_ = args_.getSeed();
  KJ_REQUIRE(batchSize_ > 0, "batch size must be at least 1");
  KJ_REQUIRE(args_.getLearningRate() > 0, "learning rate must be positive",
             args_.getLearningRate());
  if (args_.getCheckpointDir().size() > 0) {
    checkpoints_ = std::make_shared<CheckpointDir>(std::string(args_.getCheckpointDir().cStr()),
                                                   args_.getCheckpointKeep());
  }
  checkpointEvery_ = args_.getCheckpointEvery();
  killDuringCheckpoint_ = args_.getKillDuringCheckpoint();
  fresh_ = args_.getFresh();
  samplesSetting_ = args_.getSamplesSetting();
  reader_ = readerFor(args_);
  memoryBudget_ = batchMemoryBudget();
  if (args_.hasSample()) {
    // A dataset's batches: their bytes known now, before the first arrives.
    auto f = args_.getSample();
    batchBytes_ = uint64_t(batchSize_) * f.getChannels() * f.getHeight() * f.getWidth() *
                  images::dtypeBytes(images::Dtype(f.getDtype()));
  }
  tasks_ = kj::heap<kj::TaskSet>(quiet);
  self_ = std::make_shared<TrainerActor*>(this);
  auto started = kj::newPromiseAndFulfiller<void>();
  onStartedFulfiller_ = kj::mv(started.fulfiller);
  onStarted_ = started.promise.fork();
  if (args_.getScript() != 0) {
    // A local rank above 0 is another process's script, served from this one (procs per host).
    // Made by whichever comes first: this trainer, the script's stream (a later DataLoader of a
    // rank's script), or the server of a local rank's process.
    learner_ = ScriptLearner::findOrCreate(args_.getScript());
  } else {
    if (modelLearnerFactory == nullptr) {
      throw std::runtime_error(
          "train.Trainer: no training script, and this program registered no C++ model "
          "(troupe::train::addActorTypes() registers hetero_train's; addScriptActorTypes() "
          "serves scripts only)");
    }
    learner_ = modelLearnerFactory(args_);
  }
}

TrainerActor::~TrainerActor() noexcept(false) {
  *self_ = nullptr;
  learner_->detach();
}

kj::Promise<void> TrainerActor::onStart() {
  learner_->attach(*this);
  return learner_->start(context()).then([this]() { onStartedFulfiller_->fulfill(); },
                                         [this](kj::Exception&& e) {
                                           onStartedFulfiller_->reject(kj::cp(e));
                                           kj::throwFatalException(kj::mv(e));
                                         });
}

kj::Promise<void> TrainerActor::progress(ProgressContext call) {
  auto r = call.getResults();
  // The epoch being trained: while the next one's streams start ahead (during the evaluation),
  // still the one being evaluated.
  r.setEpoch(aheadEpoch_ == nullptr || epoch_ == 0 ? epoch_ : epoch_ - 1);
  r.setSteps(totalSteps_);
  uint64_t samples = stats_.samples;
  for (auto& h : history_) samples += h.samples;
  r.setSamples(samples);
  r.setWaitSeconds(totalWait_ + stats_.waitSeconds - waitBefore_);
  r.setSeconds(seconds(context().timer().now() - started_));
  r.setPlannedSteps(plannedSteps_);
  r.setResumedSteps(resumedSteps_);
  r.setResumedSamples(resumedSamples_);
  return kj::READY_NOW;
}

kj::Promise<void> TrainerActor::train(TrainContext call) {
  auto p = call.getParams();
  epochs_ = p.getEpochs();
  if (epochs_ == 0 && args_.getScript() != 0) {
    // A script's DataLoader: epochs until the script ends (its job's end stops the trainer).
    epochs_ = kUnbounded;
  }
  trainSamples_ = p.getTrainSamples();
  if (args_.getOrder().getPlanned()) {
    // A script's DataLoader: each pass's shards come from its plan (usePlan(), in runEpoch()).
    planned_ = true;
    inOrder_ = args_.getOrder().getInOrder();
    nextSession_ =
        std::max<uint64_t>(nextSession_, (uint64_t(args_.getOrder().getRank()) << 40) + 1);
  } else if (args_.getOrder().getBatched()) {
    auto o = args_.getOrder();
    data::BatchedEpoch plan{trainSamples_, batchSize_, o.getShuffle(), o.getDropLast(),
                            o.getRank(), std::max<uint32_t>(o.getRanks(), 1)};
    try {
      plan.check();
    } catch (const data::DatasetError& e) {
      KJ_FAIL_REQUIRE(e.what());
    }
    batched_ = plan;
    inOrder_ = o.getInOrder();
    // A DDP rank's streams: sessions no other rank's trainer uses (the augmenters serve them all).
    nextSession_ = std::max<uint64_t>(nextSession_, (uint64_t(plan.rank) << 40) + 1);
  }
  KJ_REQUIRE(epochs_ > 0, "train() needs at least one epoch");
  KJ_REQUIRE(p.getSources().size() > 0, "train() needs at least one augmenter");
  sources_.clear();
  augmenters_.clear();
  for (auto a : p.getSources()) addAugmenter(ActorAddress::fromProto(a));
  for (uint32_t shard = 0; shard < shardCount(); ++shard) sources_.push_back(Source{shard});
  plannedSteps_ = 0;
  for (auto& s : sources_) plannedSteps_ += (shardSize(s.shard) + batchSize_ - 1) / batchSize_;
  if (epochs_ != kUnbounded) plannedSteps_ *= epochs_;  // (unbounded: one epoch's)
  started_ = context().timer().now();
  seen_.assign(trainSamples_, 0);
  training_ = true;
  cpuAtStart_ = CpuTimes::now();
  stepsAtStart_ = totalSteps_;
  copiedBatches_ = 0;

  return onStarted_.addBranch()
      .then([this]() { return learner_->ready(); })
      .then([this]() { return restore(); })
      .then([this]() {
        // A script that ended (a DDP rank's, whose trainer the driver waits on) ends train().
        return runFrom(firstEpoch_).exclusiveJoin(learner_->ended());
      })
      .then(
          [this, call]() mutable {
            training_ = false;
            auto r = call.getResults();
            r.setDevice(learner_->device());
            auto c = r.initCheckpoints();
            c.setResumedFrom(resumedFrom_);
            c.setResumedEpoch(firstEpoch_);
            c.setResumedStep(resumedSteps_);
            c.setResumedSamples(resumedSamples_ > 0 && firstEpoch_ < history_.size()
                                    ? history_[firstEpoch_].fromCheckpoint
                                    : 0);
            c.setWritten(written_);
            c.setWriteSeconds(writeSeconds_);
            c.setLast(lastWritten_);
            auto used = CpuTimes::now() - cpuAtStart_;
            auto cpu = r.initCpu();
            cpu.setBatches(totalSteps_ - stepsAtStart_);
            cpu.setLoopSeconds(used.thread);
            cpu.setProcessSeconds(used.process);
            cpu.setCopiedBatches(copiedBatches_);
            cpu.setSteadyProcessSeconds(steadyProcessSeconds_);
            auto handoffs = learner_->handoffs();
            cpu.setHandoffs(handoffs.count);
            cpu.setHandoffSeconds(handoffs.seconds);
            auto list = r.initEpochs(history_.size());
            for (size_t i = 0; i < history_.size(); ++i) {
              auto& h = history_[i];
              auto e = list[i];
              e.setEpoch(i);
              e.setSamples(h.samples);
              e.setDuplicates(h.duplicates);
              e.setMissing(h.missing);
              e.setRejected(h.rejected);
              e.setTestAccuracy(h.accuracy);
              e.setSeconds(h.seconds);
              e.setSteps(h.steps);
              e.setStepSeconds(h.stepSeconds);
              e.setStepCpuSeconds(h.stepCpuSeconds);
              e.setFillSeconds(h.fillSeconds);
              e.setWaitSeconds(h.waitSeconds);
              e.setLoss(h.loss);
              e.setFromCheckpoint(h.fromCheckpoint);
              e.setDigest(h.digest);
              e.setSkipped(h.skipped);
              e.setAbandoned(h.abandoned);
            }
            auto skipped = r.initSkippedFiles(skippedFiles_.size());
            size_t k = 0;
            for (auto& f : skippedFiles_) skipped.set(k++, f);
            auto warned = r.initWarnedFiles(warnedFiles_.size());
            k = 0;
            for (auto& f : warnedFiles_) warned.set(k++, f);
            learner_->finished(history_);
          },
          [this](kj::Exception&& e) {
            training_ = false;
            learner_->failed(e);
            kj::throwFatalException(kj::mv(e));
          });
}

void TrainerActor::beginEpoch(uint32_t epoch, bool resumed, bool ahead) {
  epoch_ = epoch;
  queue_.clear();
  // The last epoch's streams have pushed everything (its every sample is acknowledged).
  for (auto& a : augmenters_) {
    a.streams = 0;
    a.slow = false;
  }
  for (auto& s : sources_) {
    s.queued = 0;
    if (!resumed && !ahead) s.acked = 0;
    s.produced = false;
    s.end = 0;
    s.augmenter = -1;
    s.session = 0;
    if (!planned_) s.expected = shardOrder(s.shard, epoch);
  }
  if (ahead) aheadEpoch_ = epoch;
  dispatch();
}

kj::Promise<void> TrainerActor::runFrom(uint32_t epoch) {
  if (epoch >= epochs_) return kj::READY_NOW;
  bool resumed = epoch == firstEpoch_ && !resumedFrom_.empty();
  return runEpoch(epoch, resumed).then([this, epoch]() { return runFrom(epoch + 1); });
}

kj::Promise<void> TrainerActor::runEpoch(uint32_t epoch, bool resumed) {
  if (planned_ && !(resumed && plan_)) {
    // The pass starts once the script planned it (its iter(): its sampler's batches).
    return learner_->plan(epoch).then([this, epoch](std::shared_ptr<const PassPlan> plan) {
      usePlan(kj::mv(plan));
      return runEpochNow(epoch, false);
    });
  }
  return runEpochNow(epoch, resumed);
}

kj::Promise<void> TrainerActor::runEpochNow(uint32_t epoch, bool resumed) {
  // A resumed epoch keeps what restore() put in place: the epoch's counters, the samples already
  // trained on and each shard's position.
  if (!resumed) {
    stats_ = EpochRecord();
    if (planned_) {
      seen_.assign(plan_->ids.size(), 0);
    } else {
      seen_.assign(trainSamples_, 0);
    }
    epochSecondsBefore_ = 0;
    waitBefore_ = 0;
  }
  epochStarted_ = context().timer().now();
  bool begun = false;
  KJ_IF_MAYBE(ahead, aheadEpoch_) {
    begun = *ahead == epoch && !resumed;
  }
  aheadEpoch_ = nullptr;  // `acked` is this epoch's from here on (the evaluation reset it)
  if (!begun) beginEpoch(epoch, resumed, false);
  return consume(epoch).then([this, epoch]() -> kj::Promise<void> {
    if (stopping_) return kj::NEVER_DONE;    // onStop() owns the model now
    for (auto& s : sources_) s.session = 0;  // late batches of this epoch are stale now
    stats_.missing = 0;
    for (auto v : seen_) stats_.missing += v == 0;
    KJ_IF_MAYBE(b, batched_) {
      // drop_last: the epoch's last, short batch was not trained on, by design.
      stats_.missing -= std::min<uint64_t>(stats_.missing, b->samples - b->used());
    }
    if (epoch + 1 < epochs_ && !planned_) beginEpoch(epoch + 1, false, true);
    return learner_->evaluate(context(), epoch).then([this, epoch](double accuracy) {
      KJ_IF_MAYBE(from, steadyFrom_) {
        steadyProcessSeconds_ += CpuTimes::now().process - *from;
        steadyFrom_ = nullptr;
      }
      stats_.accuracy = accuracy;
      stats_.seconds = epochSecondsBefore_ + seconds(context().timer().now() - epochStarted_);
      totalWait_ += stats_.waitSeconds - waitBefore_;
      // A planned pass is the script's: named by its loader and epoch (a pass it left after one
      // batch, a peek).
      std::string name = fmt::format(
          "epoch {}{}", epoch + 1,
          epochs_ == kUnbounded ? std::string() : "/" + std::to_string(epochs_));
      if (planned_) {
        bool peek = stats_.abandoned > 0 && stats_.steps <= 1;
        name = fmt::format("DataLoader {}: {} {}", args_.getLoader(),
                           peek ? "a peek at epoch" : "epoch", plan_->label);
      }
      spdlog::info(
          "{}: {} samples, {} duplicates, {} missing, {} rejected batches, {}{}{}, {:.1f} s",
          name,
          stats_.samples, stats_.duplicates, stats_.missing, stats_.rejected,
          stats_.skipped ? fmt::format("{} skipped (unreadable), ", stats_.skipped) : "",
          stats_.abandoned ? fmt::format("{} abandoned (the script left the epoch), ",
                                         stats_.abandoned)
                           : "",
          std::isnan(accuracy) ? std::string(args_.getScript() ? "evaluated by the script"
                                                                : "no test set")
                               : fmt::format("test accuracy {:.4f}", accuracy),
          stats_.seconds);
      history_.push_back(stats_);
      // Between epochs: the next one has trained nothing yet (what a checkpoint now holds).
      stats_ = EpochRecord();
      seen_.assign(planned_ ? 0 : trainSamples_, 0);
      for (auto& s : sources_) s.acked = 0;
      if (planned_) {
        sources_.clear();  // the next pass's come with its plan
        plan_ = nullptr;
      }
      epochSecondsBefore_ = 0;
      waitBefore_ = 0;
      epochStarted_ = context().timer().now();
      learner_->epochEnded(epoch);
    });
  });
}

uint32_t TrainerActor::shardCount() const {
  if (planned_) return uint32_t(sources_.size());
  KJ_IF_MAYBE(b, batched_) {
    return static_cast<uint32_t>(
        std::max<uint64_t>(1, (b->batches() + batchesPerShard() - 1) / batchesPerShard()));
  }
  uint64_t perShard = uint64_t(batchSize_) * kBatchesPerShard;
  return static_cast<uint32_t>(std::max<uint64_t>(1, (trainSamples_ + perShard - 1) / perShard));
}

uint64_t TrainerActor::shardSize(uint32_t shard) const {
  if (planned_) return sources_[shard].expected.size();
  KJ_IF_MAYBE(b, batched_) {
    auto [first, last] = b->shardPositions(shard, shardCount());
    return last - first;
  }
  return data::shardIndices(trainSamples_, shard, shardCount()).size();
}

std::vector<uint32_t> TrainerActor::shardOrder(uint32_t shard, uint32_t epoch) const {
  if (planned_) return sources_[shard].expected;
  KJ_IF_MAYBE(b, batched_) {
    if (epochOrderOf_ != epoch || !epochOrder_) {
      epochOrder_ = std::make_shared<const std::vector<uint32_t>>(b->order(seed_, epoch));
      epochOrderOf_ = epoch;
    }
    auto [first, last] = b->shardPositions(shard, shardCount());
    return {epochOrder_->begin() + first, epochOrder_->begin() + last};
  }
  return data::epochOrder(data::shardIndices(trainSamples_, shard, shardCount()), seed_, epoch);
}

void TrainerActor::addAugmenter(const ActorAddress& address) {
  AugmenterRef a;
  a.address = address;
  a.client = context().resolve<hetero::Augmenter>(address);
  augmenters_.push_back(kj::mv(a));
  tasks_->add(
      context().monitor(address.id).then([this, id = address.id](Exit why) { gone(id, why); }));
}

kj::Promise<void> TrainerActor::retireSources(RetireSourcesContext call) {
  for (auto id : call.getParams().getIds()) {
    for (uint32_t k = 0; k < augmenters_.size(); ++k) {
      auto& a = augmenters_[k];
      if (a.address.id != id || a.gone) continue;
      a.gone = true;
      spdlog::info("augmenter '{}' (#{}) on {} serves no more: the data group has room again",
                   a.address.name, id, a.address.host);
      for (uint32_t i = 0; i < sources_.size(); ++i) {
        if (sources_[i].augmenter == static_cast<int32_t>(k)) unassign(i);
      }
    }
  }
  dispatch();
  return kj::READY_NOW;
}

kj::Promise<void> TrainerActor::addSources(AddSourcesContext call) {
  size_t before = augmenters_.size();
  for (auto a : call.getParams().getSources()) addAugmenter(ActorAddress::fromProto(a));
  for (size_t k = before; k < augmenters_.size(); ++k) augmenters_[k].added = true;
  if (augmenters_.size() > before) {
    auto& first = augmenters_[before].address;
    spdlog::info("{} more augmenters ('{}' ... on {}): they take shards from the queue",
                 augmenters_.size() - before, first.name, first.host);
  }
  dispatch();
  return kj::READY_NOW;
}

uint64_t TrainerActor::from(const Source& s) const {
  return aheadEpoch_ == nullptr ? s.acked : 0;
}

void TrainerActor::startSource(uint32_t index) {
  auto& s = sources_[index];
  auto& a = augmenters_[s.augmenter];
  s.session = nextSession_++;
  s.since = context().timer().now();
  auto req = a.client.produceRequest();
  req.setSession(s.session);
  req.setEpoch(epoch_);
  req.setFrom(from(s));
  req.setCredits(prefetch_);
  req.setSink(kj::heap<Sink>(self_));
  req.setShard(s.shard);
  req.setShards(sources_.size());
  KJ_IF_MAYBE(b, batched_) {
    req.setRank(b->rank);
    req.setRanks(b->ranks);
  }
  if (planned_) {
    // What the stream makes, as the script planned it (its augmenter computes no order).
    req.setRank(args_.getOrder().getRank());
    auto plan = req.initPlan();
    auto ids = plan.initIds(s.expected.size());
    for (size_t k = 0; k < s.expected.size(); ++k) ids.set(k, s.expected[k]);
    auto ends = plan.initEnds(s.ends.size());
    for (size_t k = 0; k < s.ends.size(); ++k) ends.set(k, s.ends[k]);
    plan.setFirst(s.first);
    plan.setBaseSeed(plan_->baseSeed);
    plan.setLabel(plan_->label);
    if (!plan_->places.empty()) {
      auto places = plan.initPlaces(s.expected.size());
      for (size_t k = 0; k < s.expected.size(); ++k) places.set(k, plan_->places[s.first + k]);
    }
    if (!plan_->update.empty()) {
      plan.setUpdate(kj::arrayPtr(reinterpret_cast<const kj::byte*>(plan_->update.data()),
                                  plan_->update.size()));
    }
  }
  auto session = s.session;
  auto augmenter = static_cast<uint32_t>(s.augmenter);
  tasks_->add(req.send().then(
      [this, index, session, augmenter](auto response) {
        if (index >= sources_.size() || sources_[index].session != session) return;
        auto& s = sources_[index];
        // All of it was pushed: the augmenter is free for the next shard while the trainer
        // works through what it queued.
        s.end = response.getEnd();
        s.produced = true;
        // The latest shards' times only: a long run's would grow without end, and steal() sorts
        // them.
        if (shardSeconds_.size() >= kShardTimesKept) {
          shardSeconds_.erase(shardSeconds_.begin(),
                              shardSeconds_.begin() + shardSeconds_.size() / 2);
        }
        shardSeconds_.push_back(seconds(context().timer().now() - s.since));
        s.augmenter = -1;
        --augmenters_[augmenter].streams;
        dispatch();
        wake();
      },
      [this, index, session, augmenter](kj::Exception&& e) {
        if (index >= sources_.size() || sources_[index].session != session) return;
        streamBroke(index, augmenter, kj::mv(e));
      }));
}

void TrainerActor::unassign(uint32_t index) {
  auto& s = sources_[index];
  if (s.augmenter >= 0) --augmenters_[s.augmenter].streams;
  s.augmenter = -1;
  s.session = 0;  // whatever still arrives from the old stream is stale
  s.queued = 0;
  // Batches queued from the old stream are dropped: the next one resends from `acked`.
  std::erase_if(queue_, [index](const Pending& p) { return p.source == index; });
}

void TrainerActor::streamBroke(uint32_t index, uint32_t augmenter, kj::Exception error) {
  // The job is ending, or train() has (a script that ended): nothing to resume.
  if (stopping_ || !training_) return;
  auto& a = augmenters_[augmenter];
  spdlog::warn(
      "shard {}: the stream from augmenter '{}' (#{}) on {} broke ({}); the shard goes back to "
      "the queue from sample {}",
      sources_[index].shard, a.address.name, a.address.id, a.address.host,
      error.getDescription().cStr(), sources_[index].acked);
  unassign(index);
  if (!a.down && !a.gone) {
    a.down = true;
    tasks_->add(revive(augmenter));
  }
  dispatch();
}

kj::Promise<void> TrainerActor::revive(uint32_t augmenter) {
  // Until the runtime has restarted it (a new incarnation) or it is gone for good.
  return context().timer().afterDelay(200 * kj::MILLISECONDS).then([this, augmenter]() {
    auto& a = augmenters_[augmenter];
    if (a.gone || stopping_) return kj::Promise<void>(kj::READY_NOW);
    return context()
        .current(a.address.id)
        .then(
            [this, augmenter](ActorAddress address) -> kj::Promise<void> {
              auto& a = augmenters_[augmenter];
              if (a.gone) return kj::READY_NOW;
              if (address.incarnation == a.address.incarnation) return revive(augmenter);
              spdlog::info(
                  "augmenter '{}' (#{}) runs again on {} (incarnation {}); it takes shards "
                  "again",
                  address.name, address.id, address.host, address.incarnation);
              a.address = address;
              a.client = context().resolve<hetero::Augmenter>(address);
              a.down = false;
              dispatch();
              return kj::READY_NOW;
            },
            [this, augmenter](kj::Exception&&) -> kj::Promise<void> {
              // Gone for good: gone() says so; until then, keep asking.
              if (augmenters_[augmenter].gone) return kj::READY_NOW;
              return revive(augmenter);
            });
  });
}

void TrainerActor::gone(uint64_t actorId, const Exit& why) {
  if (!why.abnormal()) return;  // stopped: the job is ending
  for (uint32_t k = 0; k < augmenters_.size(); ++k) {
    auto& a = augmenters_[k];
    if (a.address.id != actorId || a.gone) continue;
    a.gone = true;
    spdlog::warn("augmenter '{}' (#{}) will not come back ({}); the others take its shards",
                 a.address.name, actorId, why.describe());
    for (uint32_t i = 0; i < sources_.size(); ++i) {
      if (sources_[i].augmenter == static_cast<int32_t>(k)) unassign(i);
    }
  }
  bool any = false;
  for (auto& a : augmenters_) any = any || !a.gone;
  if (!any && training_) {
    fatal_ = KJ_EXCEPTION(FAILED, kj::str("every augmenter is gone; ", sources_.size(),
                                          " shards of epoch ", epoch_ + 1, " cannot be served"));
    wake();
    return;
  }
  dispatch();
}

}  // namespace troupe::train
