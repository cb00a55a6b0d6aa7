// A hetero_train-shaped job whose augmenters push malformed batches in front of good ones: the
// trainer must reject each (wrong ids, wrong shape, an unknown shard, too many samples, a stale
// session), say why, and still train on every sample exactly once. The scripted augmenter serves
// the shard's epoch order with blank images (no augmentation), so the only thing under test is the
// trainer's checking of what arrives.

#include <algorithm>
#include <cstdio>
#include <vector>

#include "fault.capnp.h"
#include "train.capnp.h"
#include "trainer_actor.h"
#include "troupe/dataset/epoch.h"
#include "troupe/troupe.h"

namespace {

constexpr size_t kPixels = 784;

struct BatchSpec {
  uint64_t session;
  uint32_t epoch, shard;
  uint64_t begin;
  std::vector<uint32_t> ids;
  size_t floats;  // image floats; n * 784 when well formed
};

class ScriptedAugmenter final : public troupe::ActorBase<hetero::Augmenter> {
 public:
  explicit ScriptedAugmenter(troupe::ActorContext& context) : ActorBase(context) {
    auto args = context.args<fault::ScriptedAugmenterArgs>();
    seed_ = args.getSeed();
    batchSize_ = args.getBatchSize();
    samples_ = args.getSamples();
    corrupt_ = args.getCorrupt();
  }

  kj::Promise<void> produce(ProduceContext call) override { return produceCo(call); }

  kj::Promise<void> grant(GrantContext call) override {
    if (call.getParams().getSession() == session_) {
      credits_ += call.getParams().getCredits();
      KJ_IF_MAYBE(w, creditWaiter_) {
        (*w)->fulfill();
        creditWaiter_ = nullptr;
      }
    }
    return kj::READY_NOW;
  }

 private:
  troupe::Co<void> produceCo(ProduceContext call) {
    auto p = call.getParams();
    session_ = p.getSession();
    credits_ = p.getCredits();
    uint32_t epoch = p.getEpoch();
    auto sink = p.getSink();
    // The shard the trainer hands out (one at a time from its queue), as train.Augmenter serves.
    uint32_t index = p.getShard();
    uint32_t shards = p.getShards() > 0 ? p.getShards() : context().instanceCount();
    auto shard = troupe::data::shardIndices(samples_, index, shards);
    auto order = troupe::data::epochOrder(shard, seed_, epoch);
    uint64_t produced = 0;
    for (uint64_t pos = p.getFrom(); pos < order.size(); pos += batchSize_) {
      while (credits_ == 0) co_await creditGranted();
      --credits_;
      auto end = std::min<uint64_t>(pos + batchSize_, order.size());
      std::vector<uint32_t> ids(order.begin() + pos, order.begin() + end);
      if (corrupt_ && epoch == 0 && pos == batchSize_) {
        auto bad = malformed(index, epoch, pos, ids, order);
        for (auto& b : bad) co_await push(sink, b);
      }
      // Made before the co_await, not inside it: see troupe/co.h on g++ 12.
      BatchSpec good{session_, epoch, index, pos, ids, ids.size() * kPixels};
      co_await push(sink, good);
      produced += ids.size();
    }
    call.getResults().setEnd(order.size());
    call.getResults().setSamples(produced);
  }

  std::vector<BatchSpec> malformed(uint32_t shard, uint32_t epoch, uint64_t pos,
                                   const std::vector<uint32_t>& ids,
                                   const std::vector<uint32_t>& order) {
    size_t n = ids.size();
    auto reversed = ids;
    std::reverse(reversed.begin(), reversed.end());
    std::vector<uint32_t> tooMany(order.begin() + pos, order.begin() + pos + n + 1);
    return {
        {session_, epoch, shard, pos, reversed, n * kPixels},       // not the epoch's order
        {session_, epoch, shard, pos, ids, n * kPixels - 1},        // one float short
        {session_, epoch, 99, pos, ids, n * kPixels},               // no such shard
        {session_, epoch, shard, pos, tooMany, (n + 1) * kPixels},  // over the batch size
        {session_ + 1000, epoch, shard, pos, ids, n * kPixels},     // another session's
    };
  }

  troupe::Co<void> push(hetero::BatchSink::Client& sink, const BatchSpec& spec) {
    auto req = sink.pushRequest();
    auto b = req.initBatch();
    b.setSession(spec.session);
    b.setEpoch(spec.epoch);
    b.setShard(spec.shard);
    b.setBegin(spec.begin);
    auto list = b.initSampleIds(spec.ids.size());
    for (size_t i = 0; i < spec.ids.size(); ++i) list.set(i, spec.ids[i]);
    b.initLabels(spec.ids.size());  // all zero
    b.initImages(spec.floats * sizeof(float));
    co_await req.send();
  }

  kj::Promise<void> creditGranted() {
    auto paf = kj::newPromiseAndFulfiller<void>();
    creditWaiter_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  uint64_t seed_, samples_;
  uint32_t batchSize_;
  bool corrupt_;
  uint64_t session_ = 0;
  uint32_t credits_ = 0;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> creditWaiter_;
};

constexpr uint32_t kBatch = 64, kEpochs = 2;
constexpr uint64_t kSamples = 4096, kSeed = 7;

troupe::Co<void> drive(troupe::Driver& job) {
  auto trainer =
      job.spawn<hetero::Trainer>("train.Trainer", troupe::Placement::group("dnn_group"),
                                 troupe::SpawnOptions().args<hetero::TrainerArgs>([](auto a) {
                                   a.setBatchSize(kBatch);
                                   a.setSeed(kSeed);
                                   a.setDataDir(troupe::data::kDefaultFashionMnistDir);
                                   a.setDevice("cpu");
                                 }));
  auto augmenters = job.spawnMany<hetero::Augmenter>(
      "test.ScriptedAugmenter", troupe::Placement::prefer("data_group").perNode(1),
      troupe::SpawnOptions().args<fault::ScriptedAugmenterArgs>([](auto a) {
        a.setSeed(kSeed);
        a.setBatchSize(kBatch);
        a.setSamples(kSamples);
        a.setCorrupt(true);
      }));
  auto req = trainer.trainRequest();
  req.setEpochs(kEpochs);
  req.setTrainSamples(kSamples);
  auto sources = req.initSources(augmenters.size());
  for (size_t i = 0; i < augmenters.size(); ++i) augmenters[i].address().toProto(sources[i]);
  auto reply = co_await req.send();
  for (auto e : reply.getEpochs()) {
    printf("RESULT epoch %u: samples %lu, duplicates %lu, missing %lu, rejected %lu\n",
           e.getEpoch() + 1, (unsigned long)e.getSamples(), (unsigned long)e.getDuplicates(),
           (unsigned long)e.getMissing(), (unsigned long)e.getRejected());
  }
  fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<troupe::train::TrainerActor>("train.Trainer");
  types.add<ScriptedAugmenter>("test.ScriptedAugmenter");
  return troupe::run(argc, argv, types, [](troupe::Driver& job) { return drive(job).promise(); });
}
