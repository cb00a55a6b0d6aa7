// Fashion-MNIST's batches (batch_source.h): the IDX training set read once per process, each
// batch's images gathered and augmented by troupe/augment (hetero_train's presets) on the node's
// pool and sent as uint8 pixels with one label byte per sample; the trainer normalises them on
// its step.

#include <spdlog/spdlog.h>

#include <map>
#include <mutex>

#include "batch_source.h"
#include "clock.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/epoch.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/trace.h"

namespace troupe::train {

namespace {

augment::AugmentConfig configFrom(hetero::AugmentSettings::Reader s) {
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

class IdxSource final : public BatchSource {
 public:
  explicit IdxSource(hetero::AugmenterArgs::Reader args)
      : dir_(args.getDataDir()),
        samples_(args.getSamples()),
        seed_(args.getSeed()),
        augmenter_(std::make_shared<const augment::Augmenter>(configFrom(args.getAugment()))) {}

  kj::Promise<uint64_t> open(ActorContext& context,
                             std::shared_ptr<std::atomic<double>> spent) override {
    // Reading and unpacking the IDX files is CPU work: the pool, not the event loop.
    auto read = [dir = dir_, samples = samples_]() { return trainingSet(dir, samples); };
    return loaded_.get(context, kj::mv(spent), kj::mv(read))
        .then([this](std::shared_ptr<const data::LabeledImages> all) {
          all_ = kj::mv(all);
          return uint64_t(all_->size());
        });
  }

  kj::Promise<SourceBatch> make(ActorContext& context, const Cut& cut, uint32_t epoch,
                                uint64_t position, uint64_t end) override {
    std::vector<uint32_t> ids(cut.ids.begin() + position, cut.ids.begin() + end);
    auto batchSeed = data::mixSeed(seed_, epoch, position);
    // The pool job writes the pixels into a SendBuffer (memory of troupe's pool, reused, not
    // zeroed) that the request then lends: no copy into the message, and the job owns what it
    // writes into, so a pump cancelled meanwhile (the actor stopped, the trainer gone) leaves it
    // nothing to outlive.
    size_t n = ids.size(), pixels = all_->imageSize();
    auto pixelsOut = SendBuffer::allocate(n * pixels);
    struct Built {
      std::vector<uint8_t> labels;
      double cpu;
    };
    auto work = [all = all_, augmenter = augmenter_, ids = kj::mv(ids), batchSeed, n, pixels,
                 out = pixelsOut]() mutable {
      trace::Span span("augment", "train");
      auto cpu = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);  // gathering and augmenting: the pool's part
      auto& images = *all;
      std::vector<uint8_t> raw(n * pixels), labels(n);
      for (size_t i = 0; i < n; ++i) {
        auto img = images.image(ids[i]);
        std::copy(img.begin(), img.end(), raw.begin() + i * pixels);
        labels[i] = images.labels[ids[i]];
      }
      // Bytes, not floats: a quarter of the bytes to copy, encrypt and send; the trainer
      // normalises them on its step thread.
      augmenter->augmentPixels(raw, images.rows, images.cols, batchSeed, out.as<uint8_t>());
      return Built{kj::mv(labels), cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu};
    };
    return context.offload(kj::mv(work))
        .then([n, pixelsOut = kj::mv(pixelsOut)](Built built) mutable {
          SourceBatch out;
          out.data = kj::mv(pixelsOut);
          out.bytes = out.data.size();
          out.images = n;
          out.cpu = built.cpu;
          out.fill = [labels = kj::mv(built.labels)](hetero::Batch::Builder b) {
            b.setLabels(kj::arrayPtr(labels.data(), labels.size()));
          };
          return out;
        });
  }

 private:
  std::string dir_;
  uint64_t samples_, seed_;
  std::shared_ptr<const augment::Augmenter> augmenter_;
  OpenedOnce<data::LabeledImages> loaded_;
  std::shared_ptr<const data::LabeledImages> all_;
};

// A batch of 784-pixel images with a label byte each: uint8 pixels (x 255) the step normalises,
// or float32 already normalised.
class IdxReader final : public BatchReader {
 public:
  void read(hetero::Batch::Reader batch, StepBatch& step, std::vector<uint32_t>&,
            std::vector<std::string>&, std::vector<std::string>&) const override {
    auto labels = batch.getLabels();
    step.labels.assign(labels.begin(), labels.end());
  }

  kj::Maybe<kj::String> check(const StepBatch& b, size_t) const override {
    size_t n = b.ids.size();
    size_t sampleBytes = b.bytes ? 784 : 784 * sizeof(float);
    if (b.labels.size() == n && b.images.size() == n * sampleBytes) return nullptr;
    auto images = b.bytes ? kj::str(b.images.size(), " bytes of pixels")
                  : b.images.size() % sizeof(float) == 0
                      ? kj::str(b.images.size() / sizeof(float), " floats")
                      : kj::str(b.images.size(), " bytes of images");
    return kj::str("shape mismatch: ", n, " ids, ", b.labels.size(), " labels, ", images);
  }
};

}  // namespace

std::unique_ptr<BatchSource> idxSource(hetero::AugmenterArgs::Reader args) {
  return std::make_unique<IdxSource>(args);
}

std::unique_ptr<BatchReader> idxReader(hetero::TrainerArgs::Reader) {
  return std::make_unique<IdxReader>();
}

}  // namespace troupe::train
