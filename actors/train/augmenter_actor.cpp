#include "augmenter_actor.h"

#include <spdlog/spdlog.h>

#include "troupe/log.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>

#include "batch_maker.h"
#include "troupe/dataset/epoch.h"
#include "troupe/send_buffer.h"
#include "troupe/trace.h"

namespace troupe::train {

namespace {

double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

augment::AugmentConfig AugmenterActor::configFrom(hetero::AugmentSettings::Reader s) {
  augment::AugmentConfig c;
  c.padding = s.getPadding();
  c.flipProbability = s.getFlipProbability();
  c.maxRotationDegrees = s.getMaxRotationDegrees();
  c.brightness = s.getBrightness();
  c.contrast = s.getContrast();
  c.blurKernel = s.getBlurKernel();
  c.noiseStddev = s.getNoiseStddev();
  c.upscale = s.getUpscale();
  c.cropAreaMin = s.getCropAreaMin();
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
  dataset_ = args.getDataset();
  skipBad_ = args.getSkipBadSamples();
  batched_ = args.getOrder().getBatched();
  shuffle_ = args.getOrder().getShuffle();
  dropLast_ = args.getOrder().getDropLast();
  python_ = args.getPython();
  hasImageSeed_ = args.getOrder().getHasImageSeed();
  imageSeed_ = args.getOrder().getImageSeed();
  if (python_) {
    auto w = args.getWorkers();
    auto settings = std::make_shared<WorkerSettings>();
    settings->loader = w.getLoader();
    settings->workers = w.getWorkers();
    settings->prefetchFactor = std::max<uint32_t>(1, w.getPrefetchFactor());
    settings->sharedMemoryBytes = w.getSharedMemoryBytes();
    auto pickled = w.getPickled();
    settings->pickled.assign(reinterpret_cast<const char*>(pickled.begin()), pickled.size());
    settings->host = context.node().host().cStr();
    settings->vcpus = context.node().vcpus();
    workers_ = kj::mv(settings);
  }
  KJ_REQUIRE(!batched_ || !dataset_.empty() || python_, "a batched order needs a dataset");
  KJ_REQUIRE(!python_ || samples_ > 0, "a script's dataset needs its length (samples)");
  if (args.getPython()) {
    // A script's Dataset: batches from this process's batch maker.
  } else if (dataset_.empty()) {
    augmenter_ = std::make_shared<const augment::Augmenter>(configFrom(args.getAugment()));
  } else {
    auto pipeline = images::Pipeline::parse(args.getTransform().cStr());
    pipeline.setMaxPixels(args.getMaxImagePixels());
    pipeline_ = std::make_shared<const images::Pipeline>(kj::mv(pipeline));
  }
  KJ_REQUIRE(batchSize_ > 0, "batch size must be at least 1");
}

kj::Promise<void> AugmenterActor::onStart() {
  return load(shard_, shards_).then([this](std::shared_ptr<const Shard> shard) {
    spdlog::debug("augmenter {}/{}: the training set is loaded", shard_, shards_);
  });
}

namespace {

// The training set, read once per process and shared by its augmenters (a node runs one per
// vCPU): 47 MB of pixels each otherwise. Called on the pool; a second caller waits for the first
// one's read.
std::shared_ptr<const data::LabeledImages> trainingSet(const std::string& dir, uint64_t samples) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const data::LabeledImages>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[dir];
  if (auto kept = slot.lock()) {
    KJ_REQUIRE(samples <= kept->size(), "more training samples asked for than the dataset has",
               samples, kept->size());
    return kept;
  }
  auto all =
      std::make_shared<const data::LabeledImages>(data::loadFashionMnist(dir, data::Split::kTrain));
  KJ_REQUIRE(samples <= all->size(), "more training samples asked for than the dataset has",
             samples, all->size());
  slot = all;
  return all;
}

}  // namespace

std::shared_ptr<const data::Source> sharedSource(const std::string& path, uint64_t samples) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const data::Source>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[path];
  auto source = slot.lock();
  if (!source) {
    source = std::shared_ptr<const data::Source>(data::openSource(path));
    for (auto& note : source->notes()) spdlog::warn("{}", note);
    slot = source;
  }
  KJ_REQUIRE(samples <= source->size(), "more training samples asked for than the dataset has",
             samples, source->size(), path);
  return source;
}

kj::Promise<std::shared_ptr<const AugmenterActor::Shard>> AugmenterActor::load(uint32_t shard,
                                                                               uint32_t shards) {
  KJ_REQUIRE(shard < shards, "no such shard", shard, shards);
  if (python_) {
    // The script's Dataset: its length is all there is to load here.
    auto out = std::make_shared<Shard>();
    return std::shared_ptr<const Shard>(kj::mv(out));
  }
  if (!dataset_.empty()) {
    if (source_ == nullptr) {
      source_ = context()
                    .offload([path = dataset_, samples = samples_, spent = loadSeconds_]() {
                      auto cpu = threadCpuSeconds();
                      KJ_DEFER(spent->fetch_add(threadCpuSeconds() - cpu));
                      return sharedSource(path, samples);
                    })
                    .fork();
    }
    return KJ_ASSERT_NONNULL(source_).addBranch().then(
        [this, shard, shards](std::shared_ptr<const data::Source> source) {
          auto out = std::make_shared<Shard>();
          out->ids = data::shardIndices(samples_ ? samples_ : source->size(), shard, shards);
          out->source = kj::mv(source);
          return std::shared_ptr<const Shard>(kj::mv(out));
        });
  }
  if (trainingSet_ == nullptr) {
    // Reading and unpacking the IDX files is CPU work: the pool, not the event loop.
    trainingSet_ = context()
                       .offload([dir = dataDir_, samples = samples_, spent = loadSeconds_]() {
                         auto cpu = threadCpuSeconds();
                         KJ_DEFER(spent->fetch_add(threadCpuSeconds() - cpu));
                         return trainingSet(dir, samples);
                       })
                       .fork();
  }
  return KJ_ASSERT_NONNULL(trainingSet_)
      .addBranch()
      .then([this, shard, shards](std::shared_ptr<const data::LabeledImages> all) {
        auto out = std::make_shared<Shard>();
        out->ids = data::shardIndices(samples_ ? samples_ : all->size(), shard, shards);
        out->all = kj::mv(all);
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
        auto data = loaded.first;
        auto cut = loaded.second;
        KJ_REQUIRE(from <= cut->ids.size(), "resume position beyond the shard", from,
                   cut->ids.size());
        KJ_REQUIRE(cut->startsBatch(from), "resume position inside a batch", from);
        return pump(shard, session, epoch, data, cut, from, sink)
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
  data::BatchedEpoch whole{samples_ ? samples_ : data->source->size(), batchSize_, shuffle_,
                           dropLast_};  // (a script's dataset: samples_ is its length)
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
                                       std::shared_ptr<const Shard> data,
                                       std::shared_ptr<const Cut> cut, uint64_t position,
                                       hetero::BatchSink::Client sink) {
  auto& stream = current(shard, session);
  if (position >= cut->ids.size()) return kj::READY_NOW;
  if (data->source) return pumpDataset(shard, session, epoch, data, cut, position, sink);
  if (python_) {
    return pumpMade(shard, session, epoch, cut, position, kj::Promise<void>(kj::READY_NOW).fork(),
                    sink);
  }
  return creditAvailable(stream).then([this, shard, session, epoch, data, cut, position,
                                       sink]() mutable {
    --current(shard, session).credits;
    auto end = std::min<uint64_t>(position + batchSize_, cut->ids.size());
    std::vector<uint32_t> ids(cut->ids.begin() + position, cut->ids.begin() + end);
    // Positions within the shard's own storage, for gathering pixels.
    auto batchSeed = data::mixSeed(seed_, epoch, position);
    // The pool job writes the pixels into a SendBuffer (memory of troupe's pool, reused, not
    // zeroed) that the request then lends: no copy into the message, and the job owns what it
    // writes into, so a pump cancelled meanwhile (the actor stopped, the trainer gone) leaves it
    // nothing to outlive.
    size_t n = ids.size(), pixels = data->all->imageSize();
    auto pixelsOut = SendBuffer::allocate(n * pixels);
    struct Built {
      std::vector<uint32_t> ids;
      std::vector<uint8_t> labels;
      double cpu;
    };
    auto work = [data, augmenter = augmenter_, ids = kj::mv(ids), batchSeed, n, pixels,
                 out = pixelsOut]() mutable {
      trace::Span span("augment", "train");
      auto cpu = threadCpuSeconds();  // gathering and augmenting: the pool's part of a batch
      auto& images = *data->all;
      std::vector<uint8_t> raw(n * pixels), labels(n);
      for (size_t i = 0; i < n; ++i) {
        auto img = images.image(ids[i]);
        std::copy(img.begin(), img.end(), raw.begin() + i * pixels);
        labels[i] = images.labels[ids[i]];
      }
      // Bytes, not floats: a quarter of the bytes to copy, encrypt and send; the trainer
      // normalises them on its step thread.
      augmenter->augmentPixels(raw, images.rows, images.cols, batchSeed, out.as<uint8_t>());
      return Built{kj::mv(ids), kj::mv(labels), threadCpuSeconds() - cpu};
    };
    return context()
        .offload(kj::mv(work))
        .then([this, shard, session, epoch, data, cut, position, end, sink, n,
               pixelsOut = kj::mv(pixelsOut)](Built built) mutable {
          auto loopCpu = threadCpuSeconds();  // the request's frame and sending it: the loop's part
          auto request = sink.pushRequest();
          auto b = request.initBatch();
          heading(b, session, epoch, shard, position);
          auto list = b.initSampleIds(n);
          for (size_t i = 0; i < n; ++i) list.set(i, built.ids[i]);
          b.setLabels(kj::arrayPtr(built.labels.data(), n));
          b.adoptPixels(pixelsOut.lend(b));
          auto bytes = pixelsOut.size();
          return sendBatch(kj::mv(request), kj::mv(pixelsOut), shard, session, n, n, bytes,
                           built.cpu, loopCpu)
              .then([this, shard, session, epoch, data, cut, end, sink]() mutable {
                return pump(shard, session, epoch, data, cut, end, sink);
              });
        });
  });
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

void AugmenterActor::heading(hetero::Batch::Builder b, uint64_t session, uint32_t epoch,
                             uint32_t shard, uint64_t position) {
  b.setSession(session);
  b.setEpoch(epoch);
  b.setShard(shard);
  b.setBegin(position);
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

kj::Promise<void> AugmenterActor::sendBatch(
    capnp::StreamingRequest<hetero::BatchSink::PushParams> request, SendBuffer buffer,
    uint32_t shard, uint64_t session, uint64_t samples, uint64_t images, uint64_t bytes, double cpu,
    double loopCpu) {
  current(shard, session).produced += samples;
  images_ += images;
  batches_ += 1;
  bytes_ += bytes;
  // A streaming call: resolves at once while within the flow-control window. The connection
  // holds the lent bytes until written; the buffer rides along for a sink in this process, which
  // reads them when it runs.
  auto sent = trace::around(request.send(), "push", "stream", trace::actorRow(self().id))
                  .attach(kj::mv(buffer));
  // The pool's part of the batch, and the loop's (building the request and sending it).
  augmentSeconds_ += cpu + (loopCpu > 0 ? threadCpuSeconds() - loopCpu : 0);
  return sent;
}

kj::Promise<void> AugmenterActor::pumpDataset(uint32_t shard, uint64_t session, uint32_t epoch,
                                              std::shared_ptr<const Shard> data,
                                              std::shared_ptr<const Cut> cut,
                                              uint64_t position, hetero::BatchSink::Client sink) {
  auto& stream = current(shard, session);
  if (position >= cut->ids.size()) return kj::READY_NOW;
  return creditAvailable(stream).then(
      [this, shard, session, epoch, data, cut, position, sink]() mutable {
        --current(shard, session).credits;
        auto end = cut->end(position, batchSize_);
        std::vector<uint32_t> ids(cut->ids.begin() + position, cut->ids.begin() + end);
        // Each sample's random choices: of a planned pass from the pass's base seed and the
        // sample's position in it (troupe.data's per-sample seeds), or from the dataset's own
        // seed, the script's epoch and its id (ImageDataset(seed=)); else from (seed, epoch, id).
        // The same pixels whichever augmenter, batch or instance serves it.
        std::vector<uint64_t> seeds(ids.size());
        for (size_t k = 0; k < ids.size(); ++k) {
          seeds[k] = !cut->planned  ? data::mixSeed(seed_, epoch, ids[k])
                     : hasImageSeed_ ? data::mixSeed(imageSeed_, cut->label, ids[k])
                                     : data::sampleSeed(cut->baseSeed, cut->first + position + k);
        }
        auto& source = *data->source;
        int channels = source.encoding() == data::Encoding::kRawGrey8 ? 1 : 3;
        auto shape = pipeline_->outputShape(channels);
        size_t n = ids.size();
        size_t sampleBytes = shape.elements() * images::dtypeBytes(pipeline_->dtype());
        auto pixelsOut = SendBuffer::allocate(n * sampleBytes);
        struct Built {
          std::vector<uint32_t> ids;
          std::vector<int64_t> targets;   // of the samples not skipped
          std::vector<uint32_t> skipped;  // ids
          std::vector<std::string> skippedFiles, failure;
          std::vector<std::string> warned;  // "file: warning", decoded all the same
          double cpu;
        };
        auto work = [data, pipeline = pipeline_, ids = kj::mv(ids), seeds = kj::mv(seeds),
                     sampleBytes, skipBad = skipBad_, out = pixelsOut]() mutable {
          trace::Span span("transform", "train");
          auto cpu = threadCpuSeconds();
          auto& source = *data->source;
          Built built;
          auto bytes = out.as<uint8_t>();
          size_t kept = 0;
          // A sample that cannot be read: the job's end, naming it, or skipped. Memory and
          // filesystem errors while reading one are its errors too (a file too large to hold).
          auto bad = [&](uint32_t id, std::string why) {
            if (!skipBad) {
              built.failure.push_back(why + " (--skip-bad-samples trains on without it)");
              return false;
            }
            built.skipped.push_back(id);
            built.skippedFiles.push_back(kj::mv(why));
            return true;
          };
          for (size_t k = 0; k < ids.size(); ++k) {
            auto id = ids[k];
            try {
              auto sample = source.read(id);
              std::string warning;
              pipeline->run(sample, source.encoding(), source.rawShape(), seeds[k],
                            bytes.subspan(kept * sampleBytes, sampleBytes), &warning);
              if (!warning.empty()) built.warned.push_back(sample.name + ": " + warning);
              built.targets.push_back(sample.target);
              ++kept;
            } catch (const data::SampleError& e) {
              if (!bad(id, e.what())) break;
            } catch (const std::bad_alloc&) {
              if (!bad(id, source.nameOf(id) + ": out of memory reading or decoding it")) break;
            } catch (const std::filesystem::filesystem_error& e) {
              if (!bad(id, source.nameOf(id) + ": " + e.what())) break;
            }
          }
          built.ids = kj::mv(ids);
          built.cpu = threadCpuSeconds() - cpu;
          return built;
        };
        return context()
            .offload(kj::mv(work))
            .then([this, shard, session, epoch, data, cut, position, end, sink, n, sampleBytes,
                   pixelsOut = kj::mv(pixelsOut)](Built built) mutable -> kj::Promise<void> {
              auto loopCpu = threadCpuSeconds();
              auto request = sink.pushRequest();
              auto b = request.initBatch();
              heading(b, session, epoch, shard, position);
              if (!built.failure.empty()) return fail(kj::mv(request), built.failure.front());
              auto list = b.initSampleIds(n);
              for (size_t i = 0; i < n; ++i) list.set(i, built.ids[i]);
              size_t kept = built.targets.size();
              auto targets = b.initTargets(kept);
              for (size_t i = 0; i < kept; ++i) targets.set(i, built.targets[i]);
              b.setDtype(static_cast<uint8_t>(pipeline_->dtype()));
              if (!built.warned.empty()) {
                auto warned = b.initWarned(built.warned.size());
                for (size_t i = 0; i < built.warned.size(); ++i) warned.set(i, built.warned[i]);
              }
              if (built.skipped.empty()) {
                b.adoptPixels(pixelsOut.lend(b));
              } else {
                // Rare (a bad file): the kept samples' bytes, copied.
                b.setPixels(kj::arrayPtr(pixelsOut.bytes().begin(), kept * sampleBytes));
                skipped(b, built.skipped, built.skippedFiles);
              }
              return sendBatch(kj::mv(request), kj::mv(pixelsOut), shard, session, n, kept,
                               kept * sampleBytes, built.cpu, loopCpu)
                  .then([this, shard, session, epoch, data, cut, end, sink]() mutable {
                    return pumpDataset(shard, session, epoch, data, cut, end, sink);
                  });
            });
      });
}

}  // namespace troupe::train
