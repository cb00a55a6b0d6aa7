// The trainer's batches (trainer_actor.h): each one received from a stream, its kind's fields
// read by the kind's BatchReader (batch_source.h), checked against its shard's order and by its
// kind, counted (exactly once, skipped samples apart) and handed to the learner for its step,
// one at a time.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "clock.h"
#include "troupe/log.h"
#include "trainer_actor.h"
#include "troupe/trace.h"

namespace troupe::train {

TrainerActor::CpuTimes TrainerActor::CpuTimes::now() {
  return {cpuSeconds(CLOCK_THREAD_CPUTIME_ID), cpuSeconds(CLOCK_PROCESS_CPUTIME_ID)};
}

void TrainerActor::deliver(hetero::Batch::Reader batch) {
  Pending p;
  p.session = batch.getSession();
  p.epoch = batch.getEpoch();
  p.begin = batch.getBegin();
  p.source = batch.getShard();
  for (auto id : batch.getSampleIds()) p.step.ids.push_back(id);
  // The received message's bytes, not a copy.
  p.step.bytes = batch.hasPixels() && batch.getPixels().size() > 0;
  p.step.images = Received::keep(p.step.bytes ? batch.getPixels() : batch.getImages());
  reader_->read(batch, p.step, p.skipped, p.skippedFiles, p.warned);
  if (batch.getFailure().size() > 0 && fatal_ == nullptr) {
    // A sample that could not be read, without --skip-bad-samples: the job's end, naming it.
    fatal_ =
        KJ_EXCEPTION(FAILED, kj::str("a training sample could not be read: ", batch.getFailure()));
    wake();
    return;
  }
  copiedBatches_ += p.step.images.copied();
  if (p.step.images.size() > batchBytes_) {
    batchBytes_ = p.step.images.size();  // the largest so far (a script's batches)
    dispatch();
  }
  if (p.source < sources_.size() && sources_[p.source].session == p.session &&
      sources_[p.source].augmenter >= 0) {
    auto& a = augmenters_[sources_[p.source].augmenter];
    if (a.added) {
      a.added = false;
      spdlog::info("first batch from '{}' on {}, added as its node joined", a.address.name,
                   a.address.host);
    }
  }
  if (p.source < sources_.size() && sources_[p.source].session == p.session) {
    ++sources_[p.source].queued;
  }
  queue_.push_back(kj::mv(p));
  wake();
}

void TrainerActor::wake() {
  KJ_IF_MAYBE(w, waiter_) {
    (*w)->fulfill();
    waiter_ = nullptr;
  }
}

kj::Promise<void> TrainerActor::dataReady() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

bool TrainerActor::epochDone() const {
  for (auto& s : sources_) {
    if (s.acked < s.expected.size()) return false;
  }
  return true;
}

void TrainerActor::grant(Source& s, uint32_t credits) {
  if (s.augmenter < 0) return;  // its stream has ended (or broke)
  auto req = augmenters_[s.augmenter].client.grantRequest();
  req.setSession(s.session);
  req.setCredits(credits);
  tasks_->add(req.send().ignoreResult());
}

kj::Maybe<kj::String> TrainerActor::validate(const Pending& b, const Source& s) const {
  auto& ids = b.step.ids;
  size_t n = ids.size();
  if (planned_) {
    // The batch the plan has there, whole.
    if (n == 0 || b.begin + n != batchEnd(s, b.begin)) {
      return kj::str("a batch of ", n, " samples at position ", b.begin, " (the plan's batch there ",
                     "ends at ", batchEnd(s, b.begin), ")");
    }
  } else if (n == 0 || n > batchSize_) {
    return kj::str("a batch of ", n, " samples (batch size ", batchSize_, ")");
  }
  if (b.skippedFiles.size() != b.skipped.size()) {
    return kj::str(b.skipped.size(), " samples skipped, ", b.skippedFiles.size(), " reasons");
  }
  for (auto id : b.skipped) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end())
      return kj::str("skipped sample ", id, " is not in the batch");
  }
  KJ_IF_MAYBE(problem, reader_->check(b.step, b.skipped.size())) {
    return kj::mv(*problem);
  }
  if (b.begin + n > s.expected.size() ||
      !std::equal(ids.begin(), ids.end(), s.expected.begin() + b.begin)) {
    return kj::str("sample ids at position ", b.begin, " are not the shard's");
  }
  for (auto id : ids) {
    if (id >= trainSamples_) return kj::str("sample id ", id, " out of range");
  }
  return nullptr;
}

kj::Maybe<size_t> TrainerActor::nextInOrder(uint32_t epoch) const {
  // The epoch's next batch is the first shard's not acknowledged to its end (shards are runs of
  // batches in the epoch's order), at its acknowledged position; stale batches go too (dropped).
  size_t next = sources_.size();
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].acked < sources_[i].expected.size()) {
      next = i;
      break;
    }
  }
  for (size_t k = 0; k < queue_.size(); ++k) {
    auto& b = queue_[k];
    if (b.source >= sources_.size() || b.source == next) return k;
    auto& s = sources_[b.source];
    if (b.session != s.session || b.epoch != epoch || b.begin < s.acked) return k;
  }
  return nullptr;  // the next batch is still being made: the others wait in the queue
}

kj::Promise<void> TrainerActor::consume(uint32_t epoch) {
  if (stopping_) return kj::NEVER_DONE;  // onStop() owns the model now
  KJ_IF_MAYBE(e, fatal_) {
    return kj::cp(*e);
  }
  // The batch to take: the oldest queued; in order (BatchOrder.inOrder), the epoch's next.
  kj::Maybe<size_t> pick = queue_.empty() ? kj::Maybe<size_t>(nullptr) : size_t(0);
  if (inOrder_ && !queue_.empty()) pick = nextInOrder(epoch);
  if (pick == nullptr) {
    if (epochDone()) return kj::READY_NOW;
    // What the trainer took made room within the budget; the wait also looks again now and then
    // (a stream the trainer waits for that has run far too long is taken over).
    dispatch();
    auto waitStart = context().timer().now();
    auto ready = dataReady().exclusiveJoin(
        context().timer().afterDelay(kLookAgain).then([this]() { dispatch(); }));
    return trace::around(kj::mv(ready), "wait", "train", trace::actorRow(self().id))
        .then([this, epoch, waitStart]() {
          waitedSinceStep_ = true;
          auto waited = seconds(context().timer().now() - waitStart);
          stats_.waitSeconds += waited;
          if (stats_.steps == 0) stats_.fillSeconds += waited;  // the pipeline filling
          return consume(epoch);
        });
  }
  if (steadyFrom_ == nullptr) steadyFrom_ = CpuTimes::now().process;  // the epoch's first batch
  auto at = KJ_ASSERT_NONNULL(pick);
  auto b = kj::mv(queue_[at]);
  queue_.erase(queue_.begin() + at);
  if (b.source < sources_.size() && sources_[b.source].session == b.session &&
      sources_[b.source].queued > 0) {
    --sources_[b.source].queued;
  }
  if (b.source >= sources_.size()) {
    ++stats_.rejected;
    spdlog::warn("rejected a batch from unknown shard {}", b.source);
    return consume(epoch);
  }
  auto& s = sources_[b.source];
  if (b.session != s.session || b.epoch != epoch || b.begin != s.acked) {
    // Stale (from before a restart) or out of order: the current stream resends it. Logged once
    // per stream (after a restart a few are expected); the report counts every one.
    ++stats_.rejected;
    if (s.staleLogged != s.session) {
      s.staleLogged = s.session;
      spdlog::info(
          "rejected a batch of shard {} from stream {} at position {} of epoch {} (expected "
          "stream {} at {}, epoch {}): from before a restart or out of order, it is resent; "
          "the report counts every rejected batch",
          s.shard, b.session, b.begin, b.epoch + 1, s.session, s.acked, epoch + 1);
    }
    if (b.session == s.session) grant(s, 1);
    return consume(epoch);
  }
  KJ_IF_MAYBE(problem, validate(b, s)) {
    ++stats_.rejected;
    spdlog::warn("rejected a batch of shard {} at position {}: {}", s.shard, b.begin, *problem);
    grant(s, 1);
    return consume(epoch);
  }
  // Skipped samples (unreadable, --skip-bad-samples) are counted as seen, never missing, and
  // not as trained: not in the samples, the digest or the step.
  // (Planned, seen_ counts positions: a sampler may name a sample twice in a pass.)
  auto isSkipped = [&](uint32_t id) {
    return std::find(b.skipped.begin(), b.skipped.end(), id) != b.skipped.end();
  };
  for (size_t k = 0; k < b.step.ids.size(); ++k) {
    if (seen_[seenIndex(b.source, b.begin, k, b.step.ids[k])]++) ++stats_.duplicates;
    if (!isSkipped(b.step.ids[k])) stats_.digest += sampleDigest(b.step.ids[k]);
  }
  for (size_t k = 0; k < b.skipped.size(); ++k) {
    ++stats_.skipped;
    skippedFiles_.insert(b.skippedFiles[k]);
  }
  for (auto& w : b.warned) {
    if (warnedFiles_.insert(w).second) {
      spdlog::info("decoded despite libjpeg's warning, as PIL decodes it: {}", w);
    }
  }
  auto all = b.step.ids;
  if (!b.skipped.empty()) std::erase_if(b.step.ids, isSkipped);
  stats_.samples += b.step.ids.size();
  // Learning rate decays linearly to zero over the whole run.
  float lr = args_.getLearningRate() *
             (1.0f - static_cast<float>(totalSteps_) / std::max<uint64_t>(1, plannedSteps_));
  auto stepStart = context().timer().now();
  auto end = b.begin + b.step.ids.size() + b.skipped.size();
  grant(s, 1);  // room for the next batch while this one trains
  if (b.step.ids.empty()) {
    s.acked = end;  // every sample of it was skipped: nothing to step on
    return consume(epoch);
  }
  // The batch counts as trained from here on; a checkpoint taken while the step is on the pool
  // waits for it, or takes the batch back if the step never ran (takeBackUnappliedStep()).
  s.acked = end;
  ++stats_.steps;
  ++totalSteps_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  stepInFlight_ = StepInFlight{b.source, b.begin, b.step.ids, done, b.skipped, kj::mv(all)};
  auto step = kj::mv(b.step);
  step.epoch = epoch;
  step.learningRate = lr;
  step.done = done;
  step.waited = waitedSinceStep_;
  waitedSinceStep_ = false;
  auto ids = step.ids;
  return learner_->step(context(), kj::mv(step))
      .then([this, epoch, stepStart, ids = kj::mv(ids)](StepResult result) {
        if (result.abandoned) {
          // Made, never handed to the script: not trained on (nor missing: it was the script's).
          stats_.samples -= ids.size();
          stats_.abandoned += ids.size();
          --stats_.steps;
          --totalSteps_;
          for (auto id : ids) stats_.digest -= sampleDigest(id);
        }
        stats_.stepSeconds += seconds(context().timer().now() - stepStart);
        stats_.stepCpuSeconds += result.cpuSeconds;
        stats_.loss = result.loss;
        stepInFlight_ = nullptr;
        if (due())
          return checkpoint("every " + std::to_string(checkpointEvery_) + " steps")
              .then([this, epoch]() { return consume(epoch); });
        return consume(epoch);
      });
}

}  // namespace troupe::train
