// The augmenter actor (augmenter_actor.h): its streams, their credits, and the one pump that
// makes and pushes every kind's batches.

#include "augmenter_actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "clock.h"
#include "troupe/dataset/epoch.h"
#include "troupe/log.h"
#include "troupe/trace.h"

namespace troupe::train {

AugmenterActor::AugmenterActor(ActorContext& context) : ActorBase(context) {
  auto args = context.args<hetero::AugmenterArgs>();
  shard_ = context.instanceIndex();
  shards_ = context.instanceCount();
  samples_ = args.getSamples();
  batchSize_ = args.getBatchSize();
  seed_ = args.getSeed();
  batched_ = args.getOrder().getBatched();
  shuffle_ = args.getOrder().getShuffle();
  dropLast_ = args.getOrder().getDropLast();
  planned_ = args.getOrder().getPlanned();
  KJ_REQUIRE(!batched_ || args.getDataset().size() > 0 || args.getPython(),
             "a batched order needs a dataset");
  source_ = sourceFor(args, context);
  KJ_REQUIRE(batchSize_ > 0, "batch size must be at least 1");
}

kj::Promise<void> AugmenterActor::onStart() {
  return load(shard_, shards_).then([this](std::shared_ptr<const Shard> shard) {
    spdlog::debug("augmenter {}/{}: the training set is loaded", shard_, shards_);
  });
}

kj::Promise<std::shared_ptr<const AugmenterActor::Shard>> AugmenterActor::load(uint32_t shard,
                                                                               uint32_t shards) {
  KJ_REQUIRE(shard < shards, "no such shard", shard, shards);
  return source_->open(context(), loadSeconds_).then([this, shard, shards](uint64_t size) {
    auto out = std::make_shared<Shard>();
    out->samples = samples_ ? samples_ : size;
    // A DataLoader's augmenters make what each pass's plan names; more of them than samples
    // (num_workers=64 over 100 images) leaves some idle, as torch's extra workers are.
    if (!planned_ || shards <= out->samples) {
      out->ids = data::shardIndices(out->samples, shard, shards);
    }
    return std::shared_ptr<const Shard>(kj::mv(out));
  });
}

AugmenterActor::Stream& AugmenterActor::current(uint32_t shard, uint64_t session) {
  for (auto& [key, stream] : streams_) {
    if (uint32_t(key) == shard && stream.session == session) return stream;
  }
  kj::throwFatalException(
      KJ_EXCEPTION(DISCONNECTED, "a newer produce() session replaced this one"));
}

kj::Promise<void> AugmenterActor::produce(ProduceContext call) {
  auto p = call.getParams();
  auto session = p.getSession();
  auto epoch = p.getEpoch();
  auto from = p.getFrom();
  auto shard = p.getShard();
  auto shards = p.getShards() > 0 ? p.getShards() : shards_;
  auto rank = p.getRank();
  auto ranks = std::max<uint32_t>(p.getRanks(), 1);
  // A new session replaces the shard's previous one (the trainer reconnected after a restart).
  auto& stream = streams_[uint64_t(rank) << 32 | shard];
  KJ_IF_MAYBE(w, stream.creditWaiter) {
    (*w)->reject(KJ_EXCEPTION(DISCONNECTED, "a newer produce() session replaced this one"));
  }
  stream = Stream{session, p.getCredits()};
  if (from > 0) {
    spdlog::info("augmenter {} serves shard {} of {} from sample {} on", shard_, shard, shards,
                 from);
  }
  auto sink = p.getSink();
  // A planned pass (troupe.data.DataLoader) names what to make; else the shard's own order.
  std::shared_ptr<const Cut> planned;
  if (p.hasPlan() && p.getPlan().getIds().size() > 0) planned = cutOf(p.getPlan(), epoch);
  using Loaded = std::pair<std::shared_ptr<const Shard>, std::shared_ptr<const Cut>>;
  return load(shard, shards)
      .then([this, shard, shards, epoch, rank, ranks,
             planned](std::shared_ptr<const Shard> data) -> kj::Promise<Loaded> {
        if (planned) return Loaded(data, planned);
        return orderOf(data, shard, shards, epoch, rank, ranks).then([data](auto order) {
          auto cut = std::make_shared<Cut>();
          cut->ids = kj::mv(*order);
          return Loaded(data, kj::mv(cut));
        });
      })
      .then([this, call, shard, session, epoch, from, rank, sink](Loaded loaded) mutable {
        auto cut = loaded.second;
        KJ_REQUIRE(from <= cut->ids.size(), "resume position beyond the shard", from,
                   cut->ids.size());
        KJ_REQUIRE(cut->startsBatch(from), "resume position inside a batch", from);
        return source_->prepare(context(), sink)
            .then([this, shard, session, epoch, cut, from, sink]() mutable {
              return pump(shard, session, epoch, cut, from,
                          kj::Promise<void>(kj::READY_NOW).fork(), sink);
            })
            .then([this, call, shard, session, cut, rank]() mutable {
              auto r = call.getResults();
              r.setEnd(cut->ids.size());
              r.setSamples(current(shard, session).produced);
              // Done: the map holds only streams in progress (current() scans it per batch; with
              // in_order a shard is one batch, so kept ones would grow with the epoch).
              streams_.erase(uint64_t(rank) << 32 | shard);
            });
      });
}

std::shared_ptr<const Cut> AugmenterActor::cutOf(hetero::ShardPlan::Reader plan, uint32_t pass) {
  auto cut = std::make_shared<Cut>();
  for (auto id : plan.getIds()) {
    KJ_REQUIRE(id < samples_, "a planned sample id beyond the dataset", id, samples_);
    cut->ids.push_back(id);
  }
  uint32_t last = 0;
  for (auto end : plan.getEnds()) {
    KJ_REQUIRE(end > last && end <= cut->ids.size(), "a plan's batch ends are not ascending", end,
               last, cut->ids.size());
    cut->ends.push_back(end);
    last = end;
  }
  KJ_REQUIRE(last == cut->ids.size(), "a plan's last batch does not end the shard", last,
             cut->ids.size());
  cut->planned = true;
  cut->pass = pass;
  cut->first = plan.getFirst();
  cut->baseSeed = plan.getBaseSeed();
  cut->label = plan.getLabel();
  if (plan.hasPlaces()) {
    KJ_REQUIRE(plan.getPlaces().size() == cut->ids.size(), "a plan's places are not its ids'",
               plan.getPlaces().size(), cut->ids.size());
    for (auto place : plan.getPlaces()) cut->places.push_back(place);
  }
  auto update = plan.getUpdate();
  cut->update.assign(reinterpret_cast<const char*>(update.begin()), update.size());
  return cut;
}

namespace {

// An epoch's order of every sample (BatchedEpoch::order), computed once per process and epoch
// for its augmenters (one per vCPU, each serving shards of the same epoch): an ImageNet epoch's
// order is 5 MB and milliseconds of work. The newest few epochs are kept.
std::shared_ptr<const std::vector<uint32_t>> epochOrderOf(const data::BatchedEpoch& plan,
                                                          uint64_t seed, uint64_t epoch) {
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, bool>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const std::vector<uint32_t>>> cache;
  Key key{plan.samples, seed, epoch, plan.shuffle};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto order = std::make_shared<const std::vector<uint32_t>>(plan.order(seed, epoch));
  cache[key] = order;
  while (cache.size() > 3) {
    // The oldest epoch goes (a resumed or late stream of it computes it again).
    auto oldest = std::min_element(cache.begin(), cache.end(), [](auto& a, auto& b) {
      return std::get<2>(a.first) < std::get<2>(b.first);
    });
    cache.erase(oldest);
  }
  return order;
}

}  // namespace

kj::Promise<std::shared_ptr<std::vector<uint32_t>>> AugmenterActor::orderOf(
    std::shared_ptr<const Shard> data, uint32_t shard, uint32_t shards, uint32_t epoch,
    uint32_t rank, uint32_t ranks) {
  if (!batched_) {
    return std::make_shared<std::vector<uint32_t>>(data::epochOrder(data->ids, seed_, epoch));
  }
  data::BatchedEpoch whole{data->samples, batchSize_, shuffle_, dropLast_};
  return context().offload([whole, seed = seed_, shard, shards, epoch, rank, ranks]() {
    auto all = epochOrderOf(whole, seed, epoch);
    auto plan = whole;
    plan.rank = rank;
    plan.ranks = ranks;
    auto [first, last] = plan.shardPositions(shard, shards);
    if (ranks <= 1) {
      return std::make_shared<std::vector<uint32_t>>(all->begin() + first, all->begin() + last);
    }
    auto mine = plan.share(*all);
    return std::make_shared<std::vector<uint32_t>>(mine.begin() + first, mine.begin() + last);
  });
}

bool AugmenterActor::failsActor(kj::StringPtr method, const kj::Exception& error) const {
  if (method == "Augmenter.produce" && error.getType() == kj::Exception::Type::DISCONNECTED) {
    return false;
  }
  return ActorBase::failsActor(method, error);
}

kj::Promise<void> AugmenterActor::grant(GrantContext call) {
  auto p = call.getParams();
  for (auto& [shard, stream] : streams_) {
    if (stream.session != p.getSession()) continue;
    stream.credits += p.getCredits();
    KJ_IF_MAYBE(w, stream.creditWaiter) {
      (*w)->fulfill();
      stream.creditWaiter = nullptr;
    }
  }
  return kj::READY_NOW;  // for an older session: nothing to do
}

kj::Promise<void> AugmenterActor::creditAvailable(Stream& stream) {
  if (stream.credits > 0) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  stream.creditWaiter = kj::mv(paf.fulfiller);
  return trace::around(kj::mv(paf.promise), "credit wait", "stream", trace::actorRow(self().id));
}

kj::Promise<void> AugmenterActor::stats(StatsContext call) {
  auto r = call.getResults();
  r.setImages(images_);
  r.setAugmentSeconds(augmentSeconds_);
  r.setBatches(batches_);
  r.setBytes(bytes_);
  r.setLoadSeconds(loadSeconds_->load());
  return kj::READY_NOW;
}

kj::Promise<void> AugmenterActor::pump(uint32_t shard, uint64_t session, uint32_t epoch,
                                       std::shared_ptr<const Cut> cut, uint64_t position,
                                       kj::ForkedPromise<void> sent,
                                       hetero::BatchSink::Client sink) {
  auto& stream = current(shard, session);
  if (position >= cut->ids.size()) return sent.addBranch();
  return creditAvailable(stream).then([this, shard, session, epoch, cut, position,
                                       sent = kj::mv(sent), sink]() mutable -> kj::Promise<void> {
    --current(shard, session).credits;
    auto end = cut->end(position, batchSize_);
    auto made = source_->make(context(), *cut, epoch, position, end);
    auto pushed =
        sent.addBranch()
            .then([made = kj::mv(made)]() mutable { return kj::mv(made); })
            .then(
                [this, shard, session, epoch, cut, position, end, sink](SourceBatch batch) mutable {
                  return push(shard, session, epoch, *cut, position, end, kj::mv(batch), sink);
                })
            .fork();
    if (!source_->parallel()) {
      return pushed.addBranch().then([this, shard, session, epoch, cut, end, sink]() mutable {
        return pump(shard, session, epoch, cut, end, kj::Promise<void>(kj::READY_NOW).fork(), sink);
      });
    }
    // A push that fails (the batch could not be made, the stream ended) ends the stream now,
    // not after the batches still waiting for credit.
    auto failed = pushed.addBranch().then([]() -> kj::Promise<void> { return kj::NEVER_DONE; });
    return pump(shard, session, epoch, cut, end, kj::mv(pushed), sink)
        .exclusiveJoin(kj::mv(failed));
  });
}

kj::Promise<void> AugmenterActor::push(uint32_t shard, uint64_t session, uint32_t epoch,
                                       const Cut& cut, uint64_t position, uint64_t end,
                                       SourceBatch made, hetero::BatchSink::Client sink) {
  auto loopCpu = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);  // the request and its send: the loop's part
  auto request = sink.pushRequest();
  auto b = request.initBatch();
  b.setSession(session);
  b.setEpoch(epoch);
  b.setShard(shard);
  b.setBegin(position);
  if (!made.failure.empty()) return fail(kj::mv(request), made.failure);
  if (made.bytes >= kMaxBatchBytes) {
    // Cap'n Proto's one blob holds less than 512 MiB: named, not the connection's refusal.
    return fail(kj::mv(request),
                "a batch of " + std::to_string(end - position) + " samples is " +
                    std::to_string(made.bytes) + " bytes, more than one message carries (" +
                    std::to_string(kMaxBatchBytes) +
                    "): lower batch_size, or send uint8 pixels (a transform without ToTensor "
                    "or Normalize, normalised where it is used)");
  }
  size_t n = end - position;
  auto list = b.initSampleIds(n);
  for (size_t i = 0; i < n; ++i) list.set(i, cut.ids[position + i]);
  if (made.fill) made.fill(b);
  if (!made.warned.empty()) {
    auto warned = b.initWarned(made.warned.size());
    for (size_t i = 0; i < made.warned.size(); ++i) warned.set(i, made.warned[i]);
  }
  if (made.bytes == made.data.size()) {
    b.adoptPixels(made.data.lend(b));
  } else {
    // Rare (a bad file): the kept samples' bytes, copied.
    b.setPixels(kj::arrayPtr(made.data.bytes().begin(), made.bytes));
  }
  if (!made.skipped.empty()) skipped(b, made.skipped, made.skippedWhy);
  current(shard, session).produced += n;
  images_ += made.images;
  batches_ += 1;
  bytes_ += made.bytes;
  // A streaming call: resolves at once while within the flow-control window. The connection
  // holds the lent bytes until written; the buffer rides along for a sink in this process, which
  // reads them when it runs.
  auto sent = trace::around(request.send(), "push", "stream", trace::actorRow(self().id))
                  .attach(kj::mv(made.data));
  // The source's part of the batch, and the loop's (building the request and sending it).
  augmentSeconds_ += made.cpu + (made.loopCpu ? cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - loopCpu : 0);
  return sent;
}

void AugmenterActor::skipped(hetero::Batch::Builder b, const std::vector<uint32_t>& ids,
                             const std::vector<std::string>& why) {
  auto list = b.initSkipped(ids.size());
  auto files = b.initSkippedFiles(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    list.set(i, ids[i]);
    files.set(i, why[i]);
    spdlog::warn("augmenter {}: skipped {}", shard_, why[i]);
  }
}

kj::Promise<void> AugmenterActor::fail(
    capnp::StreamingRequest<hetero::BatchSink::PushParams> request, const std::string& why) {
  // One line here; the whole of it (a worker's traceback) goes to the trainer, which fails the
  // job with it: the script's exception shows it once.
  spdlog::error("augmenter {}: {}", shard_, why.substr(0, why.find('\n')));
  request.getBatch().setFailure(why);
  // The trainer fails the job with it: nothing more to send for this shard.
  return request.send().then([]() -> kj::Promise<void> { return kj::NEVER_DONE; });
}

}  // namespace troupe::train
