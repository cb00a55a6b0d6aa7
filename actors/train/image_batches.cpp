// A dataset's batches (batch_source.h): any dataset troupe/dataset opens (class folders, a
// manifest, WebDataset shards, IDX files), each sample decoded and transformed by the image
// pipeline's spec (troupe/images/transforms.h) on the node's pool, its random choices seeded per
// sample; sent as the transform's output in its dtype with an int64 target per sample. A sample
// that cannot be read ends the job naming its file (Batch.failure) or, with skipBadSamples, is
// left out and named in its batch (Batch.skipped).

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "batch_source.h"
#include "clock.h"
#include "troupe/dataset/epoch.h"
#include "troupe/images/transforms.h"
#include "troupe/trace.h"
#include "troupe/train/shared_source.h"

namespace troupe::train {

std::shared_ptr<const data::Source> sharedSource(const std::string& path, uint64_t samples,
                                                 bool folder) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, bool>, std::weak_ptr<const data::Source>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{path, folder}];
  auto source = slot.lock();
  if (!source) {
    source = std::shared_ptr<const data::Source>(folder ? data::openImageFolder(path)
                                                        : data::openSource(path));
    for (auto& note : source->notes()) spdlog::warn("{}", note);
    slot = source;
  }
  KJ_REQUIRE(samples <= source->size(), "more training samples asked for than the dataset has",
             samples, source->size(), path);
  return source;
}

namespace {

class ImageSource final : public BatchSource {
 public:
  explicit ImageSource(hetero::AugmenterArgs::Reader args)
      : path_(args.getDataset()),
        samples_(args.getSamples()),
        seed_(args.getSeed()),
        skipBad_(args.getSkipBadSamples()),
        folder_(args.getImageFolder()),
        hasImageSeed_(args.getOrder().getHasImageSeed()),
        imageSeed_(args.getOrder().getImageSeed()) {
    auto pipeline = images::Pipeline::parse(args.getTransform().cStr());
    pipeline.setMaxPixels(args.getMaxImagePixels());
    pipeline.setDecodeScaling(args.getDecodeScaling());
    pipeline_ = std::make_shared<const images::Pipeline>(kj::mv(pipeline));
  }

  kj::Promise<uint64_t> open(ActorContext& context,
                             std::shared_ptr<std::atomic<double>> spent) override {
    auto read = [path = path_, samples = samples_, folder = folder_]() {
      return sharedSource(path, samples, folder);
    };
    return opened_.get(context, kj::mv(spent), kj::mv(read))
        .then([this](std::shared_ptr<const data::Source> source) {
          source_ = kj::mv(source);
          return uint64_t(source_->size());
        });
  }

  kj::Promise<SourceBatch> make(ActorContext& context, const Cut& cut, uint32_t epoch,
                                uint64_t position, uint64_t end) override {
    std::vector<uint32_t> ids(cut.ids.begin() + position, cut.ids.begin() + end);
    // Each sample's random choices: of a planned pass from the pass's base seed and the sample's
    // position in it (troupe.data's per-sample seeds), or from the dataset's own seed, the
    // script's epoch and its id (ImageDataset(seed=)); else from (seed, epoch, id). The same
    // pixels whichever augmenter, batch or instance serves it.
    std::vector<uint64_t> seeds(ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      seeds[k] = !cut.planned    ? data::mixSeed(seed_, epoch, ids[k])
                 : hasImageSeed_ ? data::mixSeed(imageSeed_, cut.label, ids[k])
                                 : data::sampleSeed(cut.baseSeed, cut.placeOf(position + k));
    }
    int channels = source_->encoding() == data::Encoding::kRawGrey8 ? 1 : 3;
    auto shape = pipeline_->outputShape(channels);
    size_t sampleBytes = shape.elements() * images::dtypeBytes(pipeline_->dtype());
    auto pixelsOut = SendBuffer::allocate(ids.size() * sampleBytes);
    struct Built {
      std::vector<int64_t> targets;   // of the samples not skipped
      std::vector<uint32_t> skipped;  // ids
      std::vector<std::string> skippedFiles, failure;
      std::vector<std::string> warned;  // "file: warning", decoded all the same
      double cpu;
    };
    // How the user asks to train on without a bad sample: a DataLoader's (a planned pass) or
    // AugmentedBatches' argument, or hetero_train's flag.
    const char* skipHint = cut.planned ? " (DataLoader(skip_errors=True) trains on without it)"
                                       : " (--skip-bad-samples, or AugmentedBatches("
                                         "skip_bad_samples=True), trains on without it)";
    auto work = [source = source_, pipeline = pipeline_, ids = kj::mv(ids), seeds = kj::mv(seeds),
                 sampleBytes, skipBad = skipBad_, out = pixelsOut, skipHint]() mutable {
      trace::Span span("transform", "train");
      auto cpu = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      Built built;
      auto bytes = out.as<uint8_t>();
      size_t kept = 0;
      // A sample that cannot be read: the job's end, naming it, or skipped. Memory and
      // filesystem errors while reading one are its errors too (a file too large to hold).
      auto bad = [&](uint32_t id, std::string why) {
        if (!skipBad) {
          built.failure.push_back(why + skipHint);
          return false;
        }
        built.skipped.push_back(id);
        built.skippedFiles.push_back(kj::mv(why));
        return true;
      };
      for (size_t k = 0; k < ids.size(); ++k) {
        auto id = ids[k];
        try {
          auto sample = source->read(id);
          std::string warning;
          pipeline->run(sample, source->encoding(), source->rawShape(), seeds[k],
                        bytes.subspan(kept * sampleBytes, sampleBytes), &warning);
          if (!warning.empty()) built.warned.push_back(sample.name + ": " + warning);
          built.targets.push_back(sample.target);
          ++kept;
        } catch (const data::SampleError& e) {
          if (!bad(id, e.what())) break;
        } catch (const std::bad_alloc&) {
          if (!bad(id, source->nameOf(id) + ": out of memory reading or decoding it")) break;
        } catch (const std::filesystem::filesystem_error& e) {
          if (!bad(id, source->nameOf(id) + ": " + e.what())) break;
        }
      }
      built.cpu = cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu;
      return built;
    };
    return context.offload(kj::mv(work))
        .then([sampleBytes, dtype = pipeline_->dtype(),
               pixelsOut = kj::mv(pixelsOut)](Built built) mutable {
          SourceBatch out;
          if (!built.failure.empty()) {
            out.failure = kj::mv(built.failure.front());
            return out;
          }
          size_t kept = built.targets.size();
          out.data = kj::mv(pixelsOut);
          out.bytes = kept * sampleBytes;  // less than the buffer when samples were skipped
          out.images = kept;
          out.skipped = kj::mv(built.skipped);
          out.skippedWhy = kj::mv(built.skippedFiles);
          out.warned = kj::mv(built.warned);
          out.cpu = built.cpu;
          out.fill = [targets = kj::mv(built.targets), dtype](hetero::Batch::Builder b) {
            auto list = b.initTargets(targets.size());
            for (size_t i = 0; i < targets.size(); ++i) list.set(i, targets[i]);
            b.setDtype(static_cast<uint8_t>(dtype));
          };
          return out;
        });
  }

 private:
  std::string path_;
  uint64_t samples_, seed_;
  bool skipBad_, folder_, hasImageSeed_;
  uint64_t imageSeed_;
  std::shared_ptr<const images::Pipeline> pipeline_;
  OpenedOnce<data::Source> opened_;
  std::shared_ptr<const data::Source> source_;
};

// A batch of the transform's output: the samples not skipped, each SampleFormat's shape in its
// dtype, and their targets.
class ImageReader final : public BatchReader {
 public:
  explicit ImageReader(hetero::SampleFormat::Reader format) : format_(format) {}

  void read(hetero::Batch::Reader batch, StepBatch& step, std::vector<uint32_t>& skipped,
            std::vector<std::string>& why, std::vector<std::string>& warned) const override {
    step.bytes = true;  // pixels (of any dtype), or none when every sample was skipped
    step.dtype = batch.getDtype();
    for (auto t : batch.getTargets()) step.targets.push_back(t);
    // Targets as the MLP takes them too (hetero_train checks at start that every class fits).
    step.labels.resize(step.targets.size());
    for (size_t k = 0; k < step.targets.size(); ++k) step.labels[k] = uint8_t(step.targets[k]);
    readSkipped(batch, skipped, why, warned);
  }

  kj::Maybe<kj::String> check(const StepBatch& b, size_t skipped) const override {
    size_t n = b.ids.size(), kept = n - std::min(n, skipped);
    size_t valueSize = format_.getDtype() == 2 ? 4 : format_.getDtype() == 1 ? 2 : 1;
    size_t sampleBytes =
        size_t(format_.getChannels()) * format_.getHeight() * format_.getWidth() * valueSize;
    if (b.dtype != format_.getDtype() || b.targets.size() != kept ||
        b.images.size() != kept * sampleBytes) {
      return kj::str("shape mismatch: ", n, " ids, ", skipped, " skipped, ", b.targets.size(),
                     " targets, ", b.images.size(), " bytes of dtype ", b.dtype, " (", sampleBytes,
                     " bytes a sample)");
    }
    for (auto t : b.targets) {
      if (t < 0 || uint64_t(t) >= format_.getClasses())
        return kj::str("target ", t, " out of range (", format_.getClasses(), " classes)");
    }
    return nullptr;
  }

 private:
  hetero::SampleFormat::Reader format_;
};

}  // namespace

std::unique_ptr<BatchSource> imageSource(hetero::AugmenterArgs::Reader args) {
  return std::make_unique<ImageSource>(args);
}

std::unique_ptr<BatchReader> imageReader(hetero::TrainerArgs::Reader args) {
  return std::make_unique<ImageReader>(args.getSample());
}

}  // namespace troupe::train
