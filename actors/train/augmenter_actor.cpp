#include "augmenter_actor.h"

#include <spdlog/spdlog.h>

#include "troupe/log.h"

#include <algorithm>

#include "troupe/dataset/epoch.h"

namespace troupe::train {

AugmentConfig AugmenterActor::configFrom(hetero::AugmentSettings::Reader s) {
  AugmentConfig c;
  c.padding = s.getPadding();
  c.flipProbability = s.getFlipProbability();
  c.maxRotationDegrees = s.getMaxRotationDegrees();
  c.brightness = s.getBrightness();
  c.contrast = s.getContrast();
  c.blurKernel = s.getBlurKernel();
  c.noiseStddev = s.getNoiseStddev();
  c.validate();
  return c;
}

AugmenterActor::AugmenterActor(ActorContext& context) : ActorBase(context) {
  auto args = context.args<hetero::AugmenterArgs>();
  shard_ = context.instanceIndex();
  shards_ = context.instanceCount();
  samples_ = args.getSamples();
  batchSize_ = args.getBatchSize();
  seed_ = args.getSeed();
  dataDir_ = args.getDataDir();
  augmenter_ = std::make_shared<const Augmenter>(configFrom(args.getAugment()));
  KJ_REQUIRE(batchSize_ > 0, "batch size must be at least 1");
}

kj::Promise<void> AugmenterActor::onStart() {
  // Reading and unpacking the IDX files is CPU work: the pool, not the event loop.
  auto load =
      context().offload([dir = dataDir_, shard = shard_, shards = shards_, samples = samples_]() {
        auto all = data::loadFashionMnist(dir, data::Split::kTrain);
        KJ_REQUIRE(samples <= all.size(), "more training samples asked for than the dataset has",
                   samples, all.size());
        auto shared = std::make_shared<Shard>();
        shared->ids = data::shardIndices(samples ? samples : all.size(), shard, shards);
        shared->images = data::gatherSamples(all, shared->ids);
        return std::shared_ptr<const Shard>(kj::mv(shared));
      });
  loaded_ =
      load.then([this](std::shared_ptr<const Shard> shard) {
            spdlog::debug("augmenter shard {}/{}: {} samples", shard_, shards_, shard->ids.size());
            data_ = kj::mv(shard);
          })
          .fork();
  return loaded_.addBranch();
}

kj::Promise<void> AugmenterActor::produce(ProduceContext call) {
  auto p = call.getParams();
  auto session = p.getSession();
  auto epoch = p.getEpoch();
  auto from = p.getFrom();
  // A new session replaces the previous one (the trainer reconnected after a restart).
  session_ = session;
  credits_ = p.getCredits();
  produced_ = 0;
  KJ_IF_MAYBE(w, creditWaiter_) {
    (*w)->reject(KJ_EXCEPTION(DISCONNECTED, "a newer produce() session replaced this one"));
    creditWaiter_ = nullptr;
  }
  auto sink = p.getSink();
  return loaded_.addBranch().then([this, call, session, epoch, from, sink]() mutable {
    KJ_REQUIRE(from <= data_->ids.size(), "resume position beyond the shard", from,
               data_->ids.size());
    auto order =
        std::make_shared<std::vector<uint32_t>>(data::epochOrder(data_->ids, seed_, epoch));
    return pump(session, epoch, order, from, sink).then([this, call, order]() mutable {
      auto r = call.getResults();
      r.setEnd(order->size());
      r.setSamples(produced_);
    });
  });
}

kj::Promise<void> AugmenterActor::grant(GrantContext call) {
  auto p = call.getParams();
  if (p.getSession() != session_) return kj::READY_NOW;  // for an older session
  credits_ += p.getCredits();
  KJ_IF_MAYBE(w, creditWaiter_) {
    (*w)->fulfill();
    creditWaiter_ = nullptr;
  }
  return kj::READY_NOW;
}

kj::Promise<void> AugmenterActor::creditAvailable(uint64_t session) {
  if (credits_ > 0) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  creditWaiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<void> AugmenterActor::pump(uint64_t session, uint32_t epoch,
                                       std::shared_ptr<std::vector<uint32_t>> order,
                                       uint64_t position, hetero::BatchSink::Client sink) {
  if (session != session_) {
    return KJ_EXCEPTION(DISCONNECTED, "a newer produce() session replaced this one");
  }
  if (position >= order->size()) return kj::READY_NOW;
  return creditAvailable(session).then([this, session, epoch, order, position, sink]() mutable {
    if (session != session_) {
      return kj::Promise<void>(
          KJ_EXCEPTION(DISCONNECTED, "a newer produce() session replaced this one"));
    }
    --credits_;
    auto end = std::min<uint64_t>(position + batchSize_, order->size());
    std::vector<uint32_t> ids(order->begin() + position, order->begin() + end);
    // Positions within the shard's own storage, for gathering pixels.
    auto batchSeed = data::mixSeed(seed_, epoch, position);
    auto work = [data = data_, augmenter = augmenter_, ids, batchSeed]() {
      auto& images = data->images;
      size_t n = ids.size(), pixels = images.imageSize();
      std::vector<uint8_t> raw(n * pixels);
      std::vector<uint8_t> labels(n);
      for (size_t i = 0; i < n; ++i) {
        auto at = std::lower_bound(data->ids.begin(), data->ids.end(), ids[i]) - data->ids.begin();
        auto img = images.image(at);
        std::copy(img.begin(), img.end(), raw.begin() + i * pixels);
        labels[i] = images.labels[at];
      }
      auto out = augmenter->augment(raw, images.rows, images.cols, batchSeed);
      return std::make_pair(kj::mv(out), kj::mv(labels));
    };
    return context()
        .offload(kj::mv(work))
        .then([this, session, epoch, order, position, end, sink,
               ids = kj::mv(ids)](auto result) mutable {
          auto req = sink.pushRequest();
          auto b = req.initBatch();
          b.setSession(session);
          b.setEpoch(epoch);
          b.setShard(shard_);
          b.setBegin(position);
          auto list = b.initSampleIds(ids.size());
          for (size_t i = 0; i < ids.size(); ++i) list.set(i, ids[i]);
          b.setLabels(kj::arrayPtr(result.second.data(), result.second.size()));
          b.setImages(kj::arrayPtr(reinterpret_cast<const kj::byte*>(result.first.data()),
                                   result.first.size() * sizeof(float)));
          produced_ += ids.size();
          // A streaming call: resolves at once while within the flow-control window.
          return req.send().then([this, session, epoch, order, end, sink]() mutable {
            return pump(session, epoch, order, end, sink);
          });
        });
  });
}

}  // namespace troupe::train
