// The augmenter actor: one shard of the training set, augmented on the node's compute pool and
// streamed to the trainer in batches, at most `credits` batches ahead of what the trainer has
// consumed. Deterministic: the same (seed, epoch, position) gives the same batch, so a restarted
// augmenter resumes from the trainer's acknowledged position and the epoch still delivers every
// sample exactly once.

#pragma once

#include <memory>
#include <vector>

#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"

namespace troupe::train {

class AugmenterActor final : public ActorBase<hetero::Augmenter> {
 public:
  explicit AugmenterActor(ActorContext& context);

  kj::Promise<void> onStart() override;
  kj::Promise<void> produce(ProduceContext call) override;
  kj::Promise<void> grant(GrantContext call) override;

  static AugmentConfig configFrom(hetero::AugmentSettings::Reader settings);

 private:
  struct Shard {
    data::LabeledImages images;  // this shard's samples, indexed by position in `ids`
    std::vector<uint32_t> ids;   // global sample ids of the shard, ascending
  };

  kj::Promise<void> pump(uint64_t session, uint32_t epoch,
                         std::shared_ptr<std::vector<uint32_t>> order, uint64_t position,
                         hetero::BatchSink::Client sink);
  kj::Promise<void> creditAvailable(uint64_t session);

  uint32_t shard_, shards_, batchSize_;
  uint64_t seed_, samples_;
  std::string dataDir_;
  std::shared_ptr<const Augmenter> augmenter_;
  std::shared_ptr<const Shard> data_;
  kj::ForkedPromise<void> loaded_ = nullptr;

  uint64_t session_ = 0;  // the produce() call being served; older ones stop
  uint32_t credits_ = 0;
  uint64_t produced_ = 0;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> creditWaiter_;
};

}  // namespace troupe::train
