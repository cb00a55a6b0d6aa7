// A training script's batches (batch_source.h): its Dataset's __getitem__ and collate_fn run by
// the process's batch maker (troupe/train/batch_maker.h: the script's worker processes), several
// batches of a stream in the making at once, sent as named tensors over one buffer with how they
// nest (the Python package's encoding).

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>

#include "batch_source.h"
#include "troupe/dataset/epoch.h"
#include "troupe/train/batch_maker.h"

namespace troupe::train {

namespace {

class ScriptSource final : public BatchSource {
 public:
  ScriptSource(hetero::AugmenterArgs::Reader args, ActorContext& context)
      : samples_(args.getSamples()), seed_(args.getSeed()) {
    KJ_REQUIRE(samples_ > 0, "a script's dataset needs its length (samples)");
    auto w = args.getWorkers();
    auto settings = std::make_shared<WorkerSettings>();
    settings->loader = w.getLoader();
    settings->workers = w.getWorkers();
    settings->prefetchFactor = std::max<uint32_t>(1, w.getPrefetchFactor());
    settings->sharedMemoryBytes = w.getSharedMemoryBytes();
    auto pickled = w.getPickled();
    if (pickled.size() > 0) {
      settings->pickled = std::make_shared<const std::string>(
          reinterpret_cast<const char*>(pickled.begin()), pickled.size());
    }
    fetch_ = w.getFetched();
    settings->host = context.node().host().cStr();
    settings->vcpus = context.node().vcpus();
    workers_ = kj::mv(settings);
  }

  // The script's Dataset: its length is all there is to open here.
  kj::Promise<uint64_t> open(ActorContext&, std::shared_ptr<std::atomic<double>>) override {
    return samples_;
  }

  kj::Promise<SourceBatch> make(ActorContext&, const Cut& cut, uint32_t epoch, uint64_t position,
                                uint64_t end) override {
    auto maker = batchMaker();
    KJ_REQUIRE(maker != nullptr,
               "no batch maker in this process: a script's augmenter runs in the script's own "
               "process (troupe.data.DataLoader)");
    MakeRequest request;
    request.settings = workers_;
    request.pass = epoch;
    request.label = cut.planned ? cut.label : epoch;
    request.baseSeed = cut.planned ? cut.baseSeed : data::mixSeed(seed_, epoch);
    request.ids.assign(cut.ids.begin() + position, cut.ids.begin() + end);
    for (auto k = position; k < end; ++k) request.places.push_back(cut.placeOf(k));
    request.update = cut.update;
    auto asked = std::chrono::steady_clock::now();
    return maker->make(kj::mv(request)).then([asked, n = end - position](MadeBatch made) {
      SourceBatch out;
      if (!made.failure.empty()) {
        // Its first line says what and where; the worker's traceback follows (the script's
        // exception shows it once; log lines show the first line).
        out.failure = made.traceback.empty()
                          ? made.failure
                          : made.failure + "\nin the DataLoader worker:\n" + made.traceback;
        return out;
      }
      out.data = kj::mv(made.data);
      out.bytes = out.data.size();
      out.images = n;
      out.skipped = kj::mv(made.skipped);
      out.skippedWhy = kj::mv(made.skippedWhy);
      // The worker's time is its own process's; what the advisor counts per batch here is the
      // wait for it.
      out.cpu = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
      out.loopCpu = false;
      out.fill = [tensors = kj::mv(made.tensors),
                  structure = kj::mv(made.structure)](hetero::Batch::Builder b) {
        auto list = b.initTensors(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          auto& t = tensors[i];
          auto out = list[i];
          out.setDtype(t.dtype);
          auto shape = out.initShape(t.shape.size());
          for (size_t k = 0; k < t.shape.size(); ++k) shape.set(k, t.shape[k]);
          out.setOffset(t.offset);
          out.setBytes(t.bytes);
        }
        b.setStructure(structure);
      };
      return out;
    });
  }

  bool parallel() const override { return true; }

  kj::Promise<void> prepare(ActorContext& context, hetero::BatchSink::Client sink) override {
    if (!fetch_) return kj::READY_NOW;
    auto& f = fetchedSpecs();
    auto loader = workers_->loader;
    {
      std::lock_guard lock(f.mutex);
      auto it = f.specs.find(loader);
      if (it != f.specs.end()) {
        adopt(it->second);
        return kj::READY_NOW;
      }
      if (f.fetching.count(loader)) {
        // Another augmenter of this process is fetching it: look again shortly.
        return context.timer().afterDelay(10 * kj::MILLISECONDS).then(
            [this, &context, sink = kj::mv(sink)]() mutable { return prepare(context, sink); });
      }
      f.fetching.insert(loader);
    }
    return sink.workerSpecRequest().send().then(
        [this, loader](auto response) {
          auto bytes = response.getPickled();
          auto spec = std::make_shared<const std::string>(
              reinterpret_cast<const char*>(bytes.begin()), bytes.size());
          auto& f = fetchedSpecs();
          std::lock_guard lock(f.mutex);
          f.specs[loader] = spec;
          f.fetching.erase(loader);
          adopt(spec);
        },
        [loader](kj::Exception&& e) {
          auto& f = fetchedSpecs();
          std::lock_guard lock(f.mutex);
          f.fetching.erase(loader);  // the next stream asks again
          kj::throwFatalException(kj::mv(e));
        });
  }

 private:
  // The specs this process fetched, by loader (never freed: a process's loaders are few).
  struct Fetched {
    std::mutex mutex;
    std::map<uint32_t, std::shared_ptr<const std::string>> specs;
    std::set<uint32_t> fetching;
  };
  static Fetched& fetchedSpecs() {
    static auto* fetched = new Fetched;
    return *fetched;
  }
  void adopt(std::shared_ptr<const std::string> spec) {
    auto settings = std::make_shared<WorkerSettings>(*workers_);
    settings->pickled = kj::mv(spec);
    workers_ = kj::mv(settings);
    fetch_ = false;
  }

  uint64_t samples_, seed_;
  std::shared_ptr<const WorkerSettings> workers_;
  bool fetch_ = false;  // WorkerArgs.fetched, until prepare() has the spec
};

// A batch of tensors over the message's bytes, as the script's collate_fn made them.
class ScriptReader final : public BatchReader {
 public:
  void read(hetero::Batch::Reader batch, StepBatch& step, std::vector<uint32_t>& skipped,
            std::vector<std::string>& why, std::vector<std::string>& warned) const override {
    step.bytes = true;
    for (auto t : batch.getTensors()) {
      MadeTensor m;
      m.dtype = t.getDtype();
      for (auto d : t.getShape()) m.shape.push_back(d);
      m.offset = t.getOffset();
      m.bytes = t.getBytes();
      step.tensors.push_back(kj::mv(m));
    }
    step.structure = batch.getStructure();
    readSkipped(batch, skipped, why, warned);
  }

  kj::Maybe<kj::String> check(const StepBatch& b, size_t) const override {
    // (No tensors is a batch too: a collate_fn's numbers and strings, in its structure.)
    for (auto& t : b.tensors) {
      if (t.offset + t.bytes > b.images.size() || t.offset + t.bytes < t.offset) {
        return kj::str("a tensor of ", t.bytes, " bytes at ", t.offset, " beyond the batch's ",
                       b.images.size());
      }
      // The script makes an array of this dtype and shape over those bytes: they must be its.
      if (!tensorBytesFit(t.dtype, t.shape, t.bytes)) {
        return kj::str("a tensor of dtype '", t.dtype.c_str(), "' and shape (",
                       kj::strArray(t.shape, ", "), t.shape.size() == 1 ? ",)" : ")",
                       " is not its ", t.bytes, " bytes");
      }
    }
    return nullptr;
  }
};

}  // namespace

std::unique_ptr<BatchSource> scriptSource(hetero::AugmenterArgs::Reader args,
                                          ActorContext& context) {
  return std::make_unique<ScriptSource>(args, context);
}

std::unique_ptr<BatchReader> scriptReader(hetero::TrainerArgs::Reader) {
  return std::make_unique<ScriptReader>();
}

}  // namespace troupe::train
