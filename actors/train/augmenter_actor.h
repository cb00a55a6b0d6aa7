// The augmenter actor: shards of the training set, handed to it by the trainer one at a time,
// made into batches by its batch source and streamed to the trainer, at most `credits` batches
// ahead of what the trainer has consumed. Deterministic: the same (seed, epoch, position) gives
// the same batch, so a restarted augmenter resumes from the trainer's acknowledged position and
// the epoch still delivers every sample exactly once.
//
// What a batch holds is its source's (batch_source.h), one kind per augmenter as AugmenterArgs
// names it: Fashion-MNIST's IDX files augmented by troupe/augment, any dataset decoded and
// transformed by a torchvision-style spec, or a training script's Dataset made by its workers.
// This file owns the streams: the order of a shard, the credits, one pump for every kind.

#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "batch_source.h"
#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/send_buffer.h"

namespace troupe::train {

// The most bytes of a batch's tensors: what one Cap'n Proto blob holds (2^29 - 1).
inline constexpr size_t kMaxBatchBytes = (size_t(1) << 29) - 1;

class AugmenterActor final : public ActorBase<hetero::Augmenter> {
 public:
  explicit AugmenterActor(ActorContext& context);

  kj::Promise<void> onStart() override;
  kj::Promise<void> produce(ProduceContext call) override;
  kj::Promise<void> grant(GrantContext call) override;
  kj::Promise<void> stats(StatsContext call) override;
  bool failsActor(kj::StringPtr method, const kj::Exception& error) const override;
  // A produce() that ends DISCONNECTED lost its consumer (the trainer, or a newer session that
  // replaced it): the caller's failure, not the augmenter's.

 private:
  struct Shard {
    std::vector<uint32_t> ids;  // sample ids of the shard, ascending
    uint64_t samples = 0;       // in the epoch: AugmenterArgs.samples, or all the source holds
  };
  struct Stream {
    // The produce() call serving one shard; a newer one for the same shard replaces it.
    uint64_t session = 0;
    uint32_t credits = 0;
    uint64_t produced = 0;
    kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> creditWaiter;
  };

  // A ShardPlan checked: ids within the dataset, batch ends ascending to the shard's end.
  std::shared_ptr<const Cut> cutOf(hetero::ShardPlan::Reader plan, uint32_t pass);

  // The shard's sample ids, once the source is open.
  kj::Promise<std::shared_ptr<const Shard>> load(uint32_t shard, uint32_t shards);
  // Makes and pushes the batches of `cut` from `position` on: as many in the making at once as
  // the stream's credits where the source makes them in parallel, else one at a time; pushed in
  // the shard's order (`sent` resolves once the batch before `position` was pushed).
  kj::Promise<void> pump(uint32_t shard, uint64_t session, uint32_t epoch,
                         std::shared_ptr<const Cut> cut, uint64_t position,
                         kj::ForkedPromise<void> sent, hetero::BatchSink::Client sink);
  kj::Promise<void> push(uint32_t shard, uint64_t session, uint32_t epoch, const Cut& cut,
                         uint64_t position, uint64_t end, SourceBatch made,
                         hetero::BatchSink::Client sink);
  kj::Promise<void> creditAvailable(Stream& stream);
  // The samples a batch left out (--skip-bad-samples, skip_errors) and why, each said in the log.
  void skipped(hetero::Batch::Builder b, const std::vector<uint32_t>& ids,
               const std::vector<std::string>& why);
  // A failure that ends the shard's stream (the trainer fails the job with it).
  kj::Promise<void> fail(capnp::StreamingRequest<hetero::BatchSink::PushParams> request,
                         const std::string& why);
  Stream& current(uint32_t shard, uint64_t session);
  // The shard's stream (of any rank) if `session` still is its session; throws DISCONNECTED
  // otherwise.

  // The shard's order; of a batched order, of DDP rank `rank` of `ranks`' share.
  kj::Promise<std::shared_ptr<std::vector<uint32_t>>> orderOf(std::shared_ptr<const Shard> data,
                                                              uint32_t shard, uint32_t shards,
                                                              uint32_t epoch, uint32_t rank,
                                                              uint32_t ranks);

  uint32_t shard_, shards_, batchSize_;
  uint64_t seed_, samples_;
  // AugmenterArgs.order: shards as runs of whole batches of the epoch's order (BatchedEpoch).
  bool batched_ = false, shuffle_ = true, dropLast_ = false;
  bool planned_ = false;  // a DataLoader's: each pass's plan names what it makes
  std::unique_ptr<BatchSource> source_;
  // By (rank << 32 | shard): one stream per shard of each DDP rank's trainer, whose sessions
  // differ (TrainerActor's are rank << 40 on).
  std::map<uint64_t, Stream> streams_;
  // For stats(): what this incarnation made and pushed.
  uint64_t images_ = 0, batches_ = 0, bytes_ = 0;
  double augmentSeconds_ = 0;
  // CPU seconds opening the source (on the pool, so shared with the pool job that adds to it).
  std::shared_ptr<std::atomic<double>> loadSeconds_ = std::make_shared<std::atomic<double>>(0);
};

}  // namespace troupe::train
