// The trainer actor: pulls augmented batches from its augmenters with credit-based flow control
// (each source has at most `prefetch` batches in flight), trains an MLP on the node's device (CUDA
// when built with it and a GPU is present, else Thrust's CPU back end), and checks that every
// training sample arrives exactly once per epoch. When an augmenter's node is lost, the runtime
// restarts the augmenter elsewhere; the trainer notices the broken stream, finds the new
// incarnation and resumes that shard from the last position it acknowledged.

#pragma once

#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "train.capnp.h"
#include "troupe/actor.h"
#include "troupe/trainer/device.h"
#include "troupe/trainer/mlp.h"

namespace troupe::train {

class TrainerActor final : public ActorBase<hetero::Trainer> {
 public:
  explicit TrainerActor(ActorContext& context);
  ~TrainerActor() noexcept(false);

  kj::Promise<void> onStart() override;
  kj::Promise<void> train(TrainContext call) override;
  kj::Promise<void> progress(ProgressContext call) override;

  // Where augmenters deliver (the BatchSink capability handed to produce()).
  void deliver(hetero::Batch::Reader batch);

 private:
  struct Source {
    uint64_t actorId;
    uint32_t shard;
    uint32_t incarnation;
    hetero::Augmenter::Client client;
    uint64_t session = 0;
    uint64_t acked = 0;              // every sample before this position was trained on
    uint64_t end = 0;                // shard size, known once produce() resolved
    bool produced = false;           // produce() resolved for this epoch
    std::vector<uint32_t> expected;  // this epoch's order of the shard
  };
  struct Pending {
    uint32_t source;
    uint64_t session;
    uint32_t epoch;
    uint64_t begin;
    std::vector<uint32_t> ids;
    std::vector<uint8_t> labels;
    std::vector<float> images;
  };
  struct Test {
    std::vector<float> images;
    std::vector<uint8_t> labels;
  };
  struct EpochStats {
    uint64_t samples = 0, duplicates = 0, missing = 0, rejected = 0, steps = 0;
    double stepSeconds = 0, waitSeconds = 0, seconds = 0, loss = 0, accuracy = 0;
  };

  kj::Promise<void> runEpoch(uint32_t epoch);
  void startSource(uint32_t index);
  kj::Promise<void> recover(uint32_t index, uint64_t actorId, kj::Exception error, int attempt);
  // Waits for the augmenter serving source `index` to run again, then resumes from `acked`.
  void gone(uint64_t actorId, const Exit& why);
  // An augmenter will not come back (its node is lost and there was no room to restart it, or it
  // reached its restart limit): the shards it served go to the survivors, so a lost data instance
  // costs throughput, never samples.
  void handOver(uint32_t index);
  kj::Promise<void> consume(uint32_t epoch);
  kj::Promise<void> dataReady();
  void wake();
  bool epochDone() const;
  void grant(Source& s, uint32_t credits);
  kj::Maybe<kj::String> validate(const Pending& b, const Source& s) const;

  hetero::TrainerArgs::Reader args_;
  uint32_t batchSize_, prefetch_;
  uint64_t seed_;
  std::string dataDir_, modelDir_, deviceName_;
  std::shared_ptr<Mlp> model_;
  std::shared_ptr<const Test> test_;
  std::string deviceReason_;

  std::vector<Source> sources_;
  std::vector<ActorAddress> augmenters_;  // every augmenter train() was given
  std::set<uint64_t> gone_;               // augmenters that will not come back
  kj::Maybe<kj::Exception> fatal_;        // fails train(): no augmenter is left
  uint64_t trainSamples_ = 0;
  uint32_t epoch_ = 0, epochs_ = 0;
  uint64_t nextSession_ = 1;
  std::deque<Pending> queue_;
  std::vector<uint8_t> seen_;
  EpochStats stats_;
  std::vector<EpochStats> history_;
  uint64_t totalSteps_ = 0, plannedSteps_ = 0;
  double totalWait_ = 0;
  kj::TimePoint started_ = kj::origin<kj::TimePoint>();
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiter_;
  std::shared_ptr<TrainerActor*> self_;  // what sinks hold: cleared when the trainer goes
  kj::Own<kj::TaskSet> tasks_;
};

}  // namespace troupe::train
