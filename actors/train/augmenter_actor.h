// The augmenter actor: shards of the training set, handed to it by the trainer one at a time,
// augmented on the node's compute pool and streamed to the trainer in batches, at most `credits`
// batches ahead of what the trainer has consumed. Deterministic: the same (seed, epoch, position)
// gives the same batch, so a restarted augmenter resumes from the trainer's acknowledged position
// and the epoch still delivers every sample exactly once.
//
// Two kinds of data: Fashion-MNIST's IDX files augmented by troupe/augment (AugmenterArgs.dataDir
// and .augment: hetero_train's presets), or any dataset (troupe/dataset/source.h) decoded and
// transformed by a torchvision-style spec (troupe/images/transforms.h; AugmenterArgs.dataset and
// .transform), each sample's random choices seeded by (seed, epoch, sample id). A sample of a
// dataset that cannot be read ends the job naming its file (Batch.failure) or, with
// skipBadSamples, is skipped and named in its batch (Batch.skipped).

#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "batch_maker.h"
#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/send_buffer.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace troupe::train {

// A dataset's file list, built once per process and shared by its augmenters (one per vCPU) and
// the driver that checked it at start: listing an ImageNet folder or indexing its shards is
// seconds of work and megabytes of paths. Kept while anyone holds it. Throws SourceError (at
// open) and KJ's REQUIRE when `samples` exceeds the dataset.
std::shared_ptr<const data::Source> sharedSource(const std::string& path, uint64_t samples = 0);

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

  static augment::AugmentConfig configFrom(hetero::AugmentSettings::Reader settings);

 private:
  struct Shard {
    std::shared_ptr<const data::LabeledImages> all;  // the training set (trainingSet())
    std::shared_ptr<const data::Source> source;      // or the dataset (AugmenterArgs.dataset)
    std::vector<uint32_t> ids;                       // sample ids of the shard, ascending
  };
  struct Stream {
    // The produce() call serving one shard; a newer one for the same shard replaces it.
    uint64_t session = 0;
    uint32_t credits = 0;
    uint64_t produced = 0;
    kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> creditWaiter;
  };

  // What a stream makes: the shard's sample ids by position and where its batches end (a planned
  // pass's, from produce()'s ShardPlan; else every batchSize_), and, planned, what seeds them.
  struct Cut {
    std::vector<uint32_t> ids;
    std::vector<uint32_t> ends;  // empty: a batch every batchSize_
    bool planned = false;
    uint32_t pass = 0, label = 0;
    uint64_t first = 0, baseSeed = 0;
    uint64_t end(uint64_t position, uint32_t batchSize) const;  // of the batch at `position`
    bool startsBatch(uint64_t position) const;
  };
  // A ShardPlan checked: ids within the dataset, batch ends ascending to the shard's end.
  std::shared_ptr<const Cut> cutOf(hetero::ShardPlan::Reader plan, uint32_t pass);

  kj::Promise<std::shared_ptr<const Shard>> load(uint32_t shard, uint32_t shards);
  // The shard's sample ids, over the training set read once per process (on the pool).
  kj::Promise<void> pump(uint32_t shard, uint64_t session, uint32_t epoch,
                         std::shared_ptr<const Shard> data, std::shared_ptr<const Cut> cut,
                         uint64_t position, hetero::BatchSink::Client sink);
  kj::Promise<void> creditAvailable(Stream& stream);
  // The three pumps' shared steps: a batch's heading, a failure that ends the shard's stream
  // (the trainer fails the job with it), and sending a batch with its counts for stats().
  static void heading(hetero::Batch::Builder b, uint64_t session, uint32_t epoch, uint32_t shard,
                      uint64_t position);
  // The samples a batch left out (--skip-bad-samples, skip_errors) and why, each said in the log.
  void skipped(hetero::Batch::Builder b, const std::vector<uint32_t>& ids,
               const std::vector<std::string>& why);
  kj::Promise<void> fail(capnp::StreamingRequest<hetero::BatchSink::PushParams> request,
                         const std::string& why);
  kj::Promise<void> sendBatch(capnp::StreamingRequest<hetero::BatchSink::PushParams> request,
                              SendBuffer buffer, uint32_t shard, uint64_t session, uint64_t samples,
                              uint64_t images, uint64_t bytes, double cpu, double loopCpu);
  Stream& current(uint32_t shard, uint64_t session);
  // The shard's stream (of any rank) if `session` still is its session; throws DISCONNECTED
  // otherwise.

  uint32_t shard_, shards_, batchSize_;
  uint64_t seed_, samples_;
  std::string dataDir_;
  std::shared_ptr<const augment::Augmenter> augmenter_;
  kj::Maybe<kj::ForkedPromise<std::shared_ptr<const data::LabeledImages>>> trainingSet_;
  // A dataset: opened once per process (sharedSource()), its transform parsed here.
  std::string dataset_;
  bool skipBad_ = false;
  // AugmenterArgs.order: shards as runs of whole batches of the epoch's order (BatchedEpoch).
  bool batched_ = false, shuffle_ = true, dropLast_ = false;
  bool python_ = false;  // AugmenterArgs.python: batches from the process's batch maker
  std::shared_ptr<const WorkerSettings> workers_;  // AugmenterArgs.workers
  bool hasImageSeed_ = false;                      // BatchOrder.imageSeed
  uint64_t imageSeed_ = 0;
  // Batches of the process's batch maker: `sent` resolves once the batch before `position` was
  // pushed.
  kj::Promise<void> pumpMade(uint32_t shard, uint64_t session, uint32_t epoch,
                             std::shared_ptr<const Cut> cut, uint64_t position,
                             kj::ForkedPromise<void> sent, hetero::BatchSink::Client sink);
  kj::Promise<void> sendMade(uint32_t shard, uint64_t session, uint32_t epoch, const Cut& cut,
                             uint64_t position, uint64_t end, MadeBatch made, double waited,
                             hetero::BatchSink::Client sink);
  // The shard's order; of a batched order, of DDP rank `rank` of `ranks`' share.
  kj::Promise<std::shared_ptr<std::vector<uint32_t>>> orderOf(std::shared_ptr<const Shard> data,
                                                              uint32_t shard, uint32_t shards,
                                                              uint32_t epoch, uint32_t rank,
                                                              uint32_t ranks);
  std::shared_ptr<const images::Pipeline> pipeline_;
  kj::Maybe<kj::ForkedPromise<std::shared_ptr<const data::Source>>> source_;
  kj::Promise<void> pumpDataset(uint32_t shard, uint64_t session, uint32_t epoch,
                                std::shared_ptr<const Shard> data, std::shared_ptr<const Cut> cut,
                                uint64_t position, hetero::BatchSink::Client sink);
  // By (rank << 32 | shard): one stream per shard of each DDP rank's trainer, whose sessions
  // differ (TrainerActor's are rank << 40 on).
  std::map<uint64_t, Stream> streams_;
  // For stats(): what this incarnation augmented and pushed.
  uint64_t images_ = 0, batches_ = 0, bytes_ = 0;
  double augmentSeconds_ = 0;
  // CPU seconds loading shards (on the pool, so shared with the pool job that adds to it).
  std::shared_ptr<std::atomic<double>> loadSeconds_ = std::make_shared<std::atomic<double>>(0);
};

}  // namespace troupe::train
