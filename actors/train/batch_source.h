// File: batch_source.h
//
// One kind of batch the data group makes, seen from both ends of a stream. A kind is two halves
// in one file of its own:
//   - a BatchSource, on each augmenter (augmenter_actor.h): opens what it reads once per
//     process, then makes the batches of a stream's positions;
//   - a BatchReader, on the trainer (trainer_actor.h): reads what a batch of its kind carries
//     beyond the heading every batch has (which shard and stream, its sample ids, the samples it
//     skipped) into the learner's StepBatch, and checks it.
// The kinds today: Fashion-MNIST's IDX files augmented by troupe/augment (idx_batches.cpp), any
// dataset decoded and transformed by the image pipeline (image_batches.cpp), and a training
// script's Dataset made by its workers (script_batches.cpp). The augmenter has one pump and the
// trainer one delivery and one validation for all of them: a new kind is a new file and a line
// in batch_source.cpp's list, never a new branch in either actor.

#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>

#include "clock.h"
#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/send_buffer.h"
#include "troupe/train/learner.h"

namespace troupe::train {

// What one stream makes: the shard's sample ids by position and where its batches end (a
// planned pass's, from produce()'s ShardPlan; else every batch size), and, planned, what seeds
// its samples' random draws.
struct Cut {
  std::vector<uint32_t> ids;
  std::vector<uint32_t> ends;  // empty: a batch every batch size
  bool planned = false;
  uint32_t pass = 0, label = 0;
  uint64_t first = 0, baseSeed = 0;
  std::vector<uint64_t> places;  // planned: each id's place in the whole pass (ShardPlan.places)
  std::string update;            // planned: the Dataset's changed attributes (ShardPlan.update)
  // The place that seeds the draws of the sample at `position` of the shard (planned).
  uint64_t placeOf(uint64_t position) const {
    return places.empty() ? first + position : places[position];
  }
  uint64_t end(uint64_t position, uint32_t batchSize) const;  // of the batch at `position`
  bool startsBatch(uint64_t position) const;
};

// A batch a source made, for the pump to push (its heading and sample ids are the pump's).
struct SourceBatch {
  // The samples' bytes (Batch.pixels), lent to the message whole; when `bytes` is less (samples
  // were skipped), its first `bytes` are copied.
  SendBuffer data;
  uint64_t bytes = 0;
  uint64_t images = 0;  // samples made (the augmenter's stats())
  // Samples that could not be read, left out (--skip-bad-samples, skip_errors): ids and why.
  std::vector<uint32_t> skipped;
  std::vector<std::string> skippedWhy;
  std::vector<std::string> warned;  // "file: warning": decoded despite libjpeg's warning
  // Nonempty: the batch could not be made; the trainer fails the job with it.
  std::string failure;
  // CPU seconds it took the source (the pool's part); with `loopCpu`, the event loop's part
  // (building and sending the push) is added to it for stats().
  double cpu = 0;
  bool loopCpu = true;
  // Sets the kind's own fields of the batch (labels, targets, tensors).
  std::function<void(hetero::Batch::Builder)> fill;
};

// What a source opens (a training set, a dataset's file list): read on the pool by the first
// get(), its CPU seconds added to `spent`; later calls share the first one's result.
template <typename T>
class OpenedOnce {
 public:
  template <typename Read>
  kj::Promise<std::shared_ptr<const T>> get(ActorContext& context,
                                            std::shared_ptr<std::atomic<double>> spent, Read read) {
    if (opened_ == nullptr) {
      opened_ = context
                    .offload([spent, read = kj::mv(read)]() mutable {
                      auto cpu = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);
                      KJ_DEFER(spent->fetch_add(cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu));
                      return read();
                    })
                    .fork();
    }
    return KJ_ASSERT_NONNULL(opened_).addBranch();
  }

 private:
  kj::Maybe<kj::ForkedPromise<std::shared_ptr<const T>>> opened_;
};

// The augmenter's half of a kind.
class BatchSource {
 public:
  virtual ~BatchSource() noexcept(false) = default;  // (kj members may throw)
  // Reads what the source serves from (the training set, a dataset's file list), once per
  // process whichever augmenter asks first; resolves with the number of samples it holds.
  // `spent` adds the CPU seconds it took on the pool (the augmenter's loadSeconds).
  virtual kj::Promise<uint64_t> open(ActorContext& context,
                                     std::shared_ptr<std::atomic<double>> spent) = 0;
  // Makes the batch of positions [position, end) of `cut` in `epoch`; called on the event loop
  // after open() resolved, resolves there.
  virtual kj::Promise<SourceBatch> make(ActorContext& context, const Cut& cut, uint32_t epoch,
                                        uint64_t position, uint64_t end) = 0;
  // Whether a stream may have as many batches in the making as its credits (they are made
  // elsewhere, in parallel: a script's workers) rather than one at a time on the node's pool.
  virtual bool parallel() const { return false; }
  // Before a stream's first batch: what the source still needs from the stream's trainer
  // (`sink`), fetched once per process (a later loader's pickled WorkerSpec).
  virtual kj::Promise<void> prepare(ActorContext&, hetero::BatchSink::Client) {
    return kj::READY_NOW;
  }
};

// The trainer's half of a kind.
class BatchReader {
 public:
  virtual ~BatchReader() = default;
  // Reads the kind's fields of `batch` into `step` (whose ids, and images from Batch.pixels or
  // Batch.images, the trainer has read), and its skipped samples into `skipped` and `why`.
  virtual void read(hetero::Batch::Reader batch, StepBatch& step, std::vector<uint32_t>& skipped,
                    std::vector<std::string>& why, std::vector<std::string>& warned) const = 0;
  // What is wrong with `step` for its kind (`skipped`: how many of its samples were left out),
  // or nothing.
  virtual kj::Maybe<kj::String> check(const StepBatch& step, size_t skipped) const = 0;
};

// The kind AugmenterArgs and TrainerArgs name (batch_source.cpp). Throws KJ's REQUIRE on
// settings the kind refuses.
std::unique_ptr<BatchSource> sourceFor(hetero::AugmenterArgs::Reader args, ActorContext& context);
std::unique_ptr<BatchReader> readerFor(hetero::TrainerArgs::Reader args);

// The shared part of reading a batch that can skip samples: its skipped ids, why, and the files
// decoded despite a warning.
void readSkipped(hetero::Batch::Reader batch, std::vector<uint32_t>& skipped,
                 std::vector<std::string>& why, std::vector<std::string>& warned);

}  // namespace troupe::train
