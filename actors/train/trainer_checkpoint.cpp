// The trainer's checkpoints: writing its state between two steps, and resuming from it
// (trainer_actor.h; the file format is checkpoint.h).

#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "troupe/dataset/epoch.h"
#include "troupe/log.h"
#include "clock.h"
#include "trainer_actor.h"

namespace troupe::train {

JobIdentity TrainerActor::identity() const {
  JobIdentity id;
  id.trainSamples = samplesSetting_;
  id.batchSize = batchSize_;
  id.layerSizes = learner_->shape();
  id.seed = seed_;
  id.epochs = epochs_;
  id.learningRate = args_.getLearningRate();
  id.momentum = args_.getMomentum();
  return id;
}

namespace {

// Where a refused checkpoint becomes the trainer's failure. The checkpoint code throws
// CheckpointError, here as in main() (hetero_train's --resume check) and in a script's
// load_state_dict(); on the event loop and the pool an actor fails with a kj::Exception, which
// carries the same text (not KJ's "std::exception: ..." rendering of a foreign exception).
template <typename F>
auto refusing(F&& f) {
  try {
    return f();
  } catch (const CheckpointError& e) {
    kj::throwFatalException(
        kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(e.what())));
  }
}

}  // namespace

kj::Promise<void> TrainerActor::restore() {
  if (auto given = learner_->givenState()) {
    // A script's load_state_dict(): checked as a checkpoint file is.
    refusing([&] {
      auto differences = given->state.identity.differences(identity());
      if (!differences.empty()) {
        throw CheckpointError(given->path.string() + " was saved by another job: " + differences +
                              "; resume it with the same settings, or start "
                              "without it");
      }
      apply(*given);
    });
    return kj::READY_NOW;
  }
  if (!checkpoints_) return kj::READY_NOW;
  savedSteps_ = 0;
  if (killDuringCheckpoint_ > 0) {
    // The test hook: die like a process killed at the worst moment of a write.
    auto writes = std::make_shared<uint32_t>(0);
    checkpoints_->beforeRename([writes, n = killDuringCheckpoint_](const std::filesystem::path& t) {
      if (++*writes < n) return;
      spdlog::warn(
          "test hook: killing this process during checkpoint write {}: {} is written and "
          "synced, not renamed",
          n, t.string());
      spdlog::default_logger()->flush();
      kill(getpid(), SIGKILL);
    });
  }
  if (fresh_) {
    if (auto aside = checkpoints_->setAside()) {
      spdlog::warn("--fresh: the checkpoints of {} are set aside in {}; training starts over",
                   checkpoints_->path().string(), aside->string());
    }
    return kj::READY_NOW;
  }
  // Reading and checking a few MiB, and loading the model onto its device: the pool's work.
  return context()
      .offload([dir = checkpoints_, id = identity(), learner = learner_]() {
        return refusing([&] {
          auto loaded = dir->latest(id);
          if (loaded) learner->load(loaded->state, loaded->path.string());
          return loaded;
        });
      })
      .then([this](std::optional<LoadedCheckpoint> loaded) {
        if (loaded) {
          refusing([&] { apply(*loaded); });
        } else {
          spdlog::info("no checkpoint in {}: training starts at epoch 1",
                       checkpoints_->path().string());
        }
      });
}

void TrainerActor::apply(const LoadedCheckpoint& loaded) {
  auto& s = loaded.state;
  auto name = loaded.path.string();
  auto fresh = "start over with --fresh (it sets the checkpoints aside)";
  if (planned_) {
    // A script's state: the pass in progress as it planned it, if it had begun one.
    if (s.plan) {
      usePlan(std::make_shared<const PassPlan>(*s.plan));
    } else {
      sources_.clear();
      plan_ = nullptr;
    }
    bool fits = s.acked.size() == sources_.size() &&
                s.seen.size() == (plan_ ? plan_->ids.size() : 0) && s.history.size() == s.epoch;
    for (uint32_t i = 0; fits && i < sources_.size(); ++i) {
      fits = s.acked[i] <= sources_[i].expected.size();
    }
    if (!fits) {
      throw CheckpointError(name + " does not fit its own plan (" +
                            std::to_string(s.acked.size()) + " shard positions, " +
                            std::to_string(s.seen.size()) + " samples counted): it is damaged");
    }
  } else if (s.acked.size() != sources_.size()) {
    throw CheckpointError("checkpoint " + name + " was written by a job with " +
                          std::to_string(s.acked.size()) + " shards per epoch; this one has " +
                          std::to_string(sources_.size()) +
                          " (the batch size or the troupe version differs): resume it with the "
                          "same settings, or " +
                          fresh);
  }
  if (!planned_ &&
      (s.seen.size() != trainSamples_ || s.epoch > epochs_ || s.history.size() != s.epoch)) {
    throw CheckpointError(
        "checkpoint " + name + " does not fit this job: " + std::to_string(s.seen.size()) +
        " samples per epoch there, " + std::to_string(trainSamples_) + " here; epoch " +
        std::to_string(s.epoch) + " with " + std::to_string(s.history.size()) + " finished, of " +
        std::to_string(epochs_) + "; " + fresh);
  }
  for (uint32_t i = 0; i < sources_.size() && s.epoch < epochs_; ++i) {
    auto size = shardSize(i);
    if (s.acked[i] > size) {
      throw CheckpointError("checkpoint " + name + ": shard " + std::to_string(i) +
                            " at position " + std::to_string(s.acked[i]) + " of " +
                            std::to_string(size) + "; " + fresh);
    }
    sources_[i].acked = s.acked[i];
  }
  firstEpoch_ = s.epoch;
  epoch_ = s.epoch;
  history_ = s.history;
  stats_ = s.current;
  stats_.fromCheckpoint = s.current.samples;
  seen_ = s.seen;
  if (stats_.digest == 0 && !planned_) {
    // A checkpoint from before the digest: the samples it counted, each as often as it did.
    for (size_t id = 0; id < seen_.size(); ++id) stats_.digest += seen_[id] * sampleDigest(id);
  }
  totalSteps_ = s.steps;
  epochSecondsBefore_ = s.current.seconds;
  waitBefore_ = s.current.waitSeconds;
  resumedSteps_ = s.steps;
  resumedSamples_ = s.current.samples;
  for (auto& h : history_) resumedSamples_ += h.samples;
  resumedFrom_ = name;
  savedSteps_ = s.steps;
  std::string positions;
  for (auto a : s.acked) positions += (positions.empty() ? "" : " ") + std::to_string(a);
  std::string done;
  if (history_.size() == 1) {
    done = fmt::format("; epoch 1 was done (test accuracy {:.4f})", history_.back().accuracy);
  } else if (!history_.empty()) {
    done = fmt::format("; epochs 1-{} were done (test accuracy {:.4f})", history_.size(),
                       history_.back().accuracy);
  }
  spdlog::info(
      "resumed from checkpoint {} ({}): epoch {}/{} from sample {} of {} (shard positions {}), "
      "step {} of {}{}",
      name, s.writtenBy, std::min(s.epoch + 1, epochs_), epochs_, s.current.samples, trainSamples_,
      positions, s.steps, plannedSteps_, done);
}

bool TrainerActor::due() const {
  return checkpoints_ && checkpointEvery_ > 0 && totalSteps_ % checkpointEvery_ == 0 && !stopping_;
}

TrainingState TrainerActor::snapshot() {
  TrainingState s;
  s.identity = identity();
  s.epoch = history_.size();  // the epoch in progress (history_ holds the finished ones)
  s.steps = totalSteps_;
  for (auto& src : sources_) s.acked.push_back(src.acked);  // sources_[i] serves shard i
  s.seen = seen_;
  s.current = stats_;
  s.current.seconds = epochSecondsBefore_ + seconds(context().timer().now() - epochStarted_);
  s.history = history_;
  KJ_IF_MAYBE(step, stepInFlight_) {
    if (!step->done->load()) {
      // The learner does not have it yet: the batch is sent again after a resume.
      s.acked[step->source] = step->begin;
      untrain(*step, s.seen, s.current);
      --s.steps;
    }
  }
  if (planned_ && plan_ != nullptr && !sources_.empty()) s.plan = *plan_;
  return s;
}

void TrainerActor::untrain(const StepInFlight& step, std::vector<uint8_t>& seen,
                           EpochRecord& stats) const {
  for (size_t k = 0; k < step.all.size(); ++k) {
    auto id = step.all[k];
    auto& count = seen[seenIndex(step.source, step.begin, k, id)];
    if (count > 0 && --count > 0) --stats.duplicates;
    if (std::find(step.skipped.begin(), step.skipped.end(), id) != step.skipped.end()) {
      --stats.skipped;
    } else {
      stats.digest -= sampleDigest(id);
    }
  }
  stats.samples -= step.ids.size();
  --stats.steps;
}

void TrainerActor::takeBackUnappliedStep() {
  KJ_IF_MAYBE(step, stepInFlight_) {
    if (!step->done->load()) {
      // Its pool job was cancelled before it started: the model never saw the batch.
      sources_[step->source].acked = step->begin;
      untrain(*step, seen_, stats_);
      --totalSteps_;
      spdlog::info("the step in flight did not run: shard {} resumes from sample {}",
                   sources_[step->source].shard, step->begin);
    }
  }
  stepInFlight_ = nullptr;
}

kj::Promise<void> TrainerActor::checkpoint(std::string why) {
  auto state = std::make_shared<TrainingState>(snapshot());
  state->writtenBy = std::string(node().host().cStr()) + ", " + why;
  auto start = context().timer().now();
  auto steps = totalSteps_;
  auto epoch = state->epoch;
  auto samples = state->current.samples;
  return context()
      .offload([dir = checkpoints_, learner = learner_, state]() {
        learner->save(*state);
        return dir->write(*state).string();
      })
      .then(
          [this, start, steps, epoch, samples, why](std::string path) {
            double took = seconds(context().timer().now() - start);
            savedSteps_ = steps;
            ++written_;
            writeSeconds_ += took;
            lastWritten_ = path;
            failedInARow_ = 0;
            spdlog::info(
                "checkpoint {} written ({}): epoch {}/{} at sample {} of {}, step {}, "
                "{:.0f} ms",
                path, why, std::min(epoch + 1, epochs_), epochs_, samples, trainSamples_, steps,
                took * 1000);
          },
          [this](kj::Exception&& e) {
            // One failure may pass (the next one is due soon); two in a row fail the job: it
            // asked for checkpoints, and one that cannot write them cannot resume after an
            // interruption (docs/exit-codes.md).
            ++failedInARow_;
            auto newest = lastWritten_.empty() ? std::string("there is none") : lastWritten_;
            spdlog::error("checkpoint not written: {}; the newest one is still {}",
                          e.getDescription().cStr(), newest);
            if (failedInARow_ >= kCheckpointFailuresInARow && !stopping_) {
              kj::throwFatalException(KJ_EXCEPTION(
                  FAILED, kj::str("checkpoints cannot be written: ", failedInARow_,
                                  " failed in a row, the last with '", e.getDescription(),
                                  "' (the newest is ", newest,
                                  "); free space or fix --checkpoint-dir, then run the job "
                                  "again: it resumes from the newest one")));
            }
          });
}

kj::Promise<void> TrainerActor::onStop() {
  if (!training_) return learner_->stopping();
  if (!checkpoints_) {
    // A script saves its own state (state_dict()) once told: no new step starts meanwhile (a
    // DDP rank's script takes its steps up to the one the ranks agree to stop at).
    if (!learner_->stepsWhileStopping()) stopping_ = true;
    return learner_->stopping();
  }
  // No new step, evaluation or checkpoint starts from here; the one on the pool, if any, ends
  // first, so the model and the counters agree.
  stopping_ = true;
  return context().work().whenIdle().then([this]() -> kj::Promise<void> {
    takeBackUnappliedStep();
    if (totalSteps_ == savedSteps_) {
      spdlog::info("stopped at step {}: nothing new since the newest checkpoint", totalSteps_);
      return kj::READY_NOW;
    }
    return checkpoint("on stop, before training ended");
  });
}

}  // namespace troupe::train
