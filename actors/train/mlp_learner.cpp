// hetero_train's MLP as the trainer's learner (mlp_learner.h).

#include "mlp_learner.h"

#include <spdlog/spdlog.h>

#include "troupe/log.h"
#include <time.h>

#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"
#include "troupe/trace.h"

namespace troupe::train {

MlpLearner::MlpLearner(hetero::TrainerArgs::Reader args)
    : deviceName_(args.getDevice()), dataDir_(args.getDataDir()), modelDir_(args.getModelDir()) {
  config_.learningRate = args.getLearningRate();
  config_.momentum = args.getMomentum();
  config_.seed = args.getSeed();
  if (args.hasSample()) {
    auto f = args.getSample();
    dataset_ = true;
    dtype_ = f.getDtype();
    config_.layerSizes.front() = int(f.getChannels() * f.getHeight() * f.getWidth());
    config_.layerSizes.back() = int(f.getClasses());
    testDataset_ = args.getTestDataset();
    testTransform_ = args.getTestTransform();
  }
}

namespace {

// A dataset's test split as the model takes it: every sample through the test transform (no
// random op, so seed 0 is as good as any), as floats.
std::vector<float> testInputs(const data::Source& source, const images::Pipeline& pipeline,
                              size_t inputSize, std::vector<uint8_t>& labels) {
  int channels = source.encoding() == data::Encoding::kRawGrey8 ? 1 : 3;
  auto shape = pipeline.outputShape(channels);
  if (shape.elements() != inputSize) {
    throw std::runtime_error("the test transform writes " + std::to_string(shape.elements()) +
                             " values a sample, the training one " + std::to_string(inputSize) +
                             ": give --test-transform the training transform's output size");
  }
  auto dtype = pipeline.dtype();
  std::vector<uint8_t> bytes(inputSize * images::dtypeBytes(dtype));
  std::vector<float> out(source.size() * inputSize);
  labels.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    auto sample = source.read(i);
    pipeline.run(sample, source.encoding(), source.rawShape(), 0, bytes);
    images::toFloat(bytes, dtype, std::span<float>(out.data() + i * inputSize, inputSize));
    labels[i] = uint8_t(sample.target);
  }
  return out;
}

}  // namespace

std::vector<int> MlpLearner::shape() const {
  return config_.layerSizes;
}

kj::Promise<void> MlpLearner::start(ActorContext& context) {
  auto kind = deviceName_ == "cpu"    ? trainer::DeviceKind::kCpu
              : deviceName_ == "cuda" ? trainer::DeviceKind::kCuda
                                      : trainer::DeviceKind::kAuto;
  auto selection = trainer::selectDevice(kind);
  deviceReason_ = selection.reason;
  spdlog::info("trainer on {}: {}", context.node().host(), deviceReason_);
  model_ = std::make_shared<trainer::Mlp>(config_, std::move(selection.device));
  if (dataset_) {
    if (testDataset_.empty()) return kj::READY_NOW;  // no test set: no accuracy
    return context
        .offload(
            [path = testDataset_, spec = testTransform_, inputs = config_.layerSizes.front()]() {
              auto source = data::openSource(path);
              auto pipeline = images::Pipeline::parse(spec);
              auto test = std::make_shared<Test>();
              test->images = testInputs(*source, pipeline, size_t(inputs), test->labels);
              return std::shared_ptr<const Test>(kj::mv(test));
            })
        .then([this](std::shared_ptr<const Test> test) {
          spdlog::info("test set: {} samples from {}", test->labels.size(), testDataset_);
          test_ = kj::mv(test);
        });
  }
  return context
      .offload([dir = dataDir_]() {
        auto set = data::loadFashionMnist(dir, data::Split::kTest);
        auto test = std::make_shared<Test>();
        test->images = augment::normalizeImages(set.pixels);
        test->labels = set.labels;
        return std::shared_ptr<const Test>(kj::mv(test));
      })
      .then([this](std::shared_ptr<const Test> test) { test_ = kj::mv(test); });
}

kj::Promise<StepResult> MlpLearner::step(ActorContext& context, StepBatch b) {
  return context.offload([model = model_, gaps = gaps_, b = kj::mv(b)]() {
    trace::Span span("step", "train");
    {
      std::lock_guard lock(gaps->mutex);
      auto start = std::chrono::steady_clock::now();
      if (!b.waited && gaps->lastEnd != std::chrono::steady_clock::time_point{}) {
        ++gaps->total.count;
        gaps->total.seconds += std::chrono::duration<double>(start - gaps->lastEnd).count();
      }
    }
    model->setLearningRate(std::max(b.learningRate, 1e-5f));
    timespec before{}, after{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before);
    StepResult r;
    if (!b.targets.empty() || b.dtype != 0) {
      // A dataset's samples, in the transform's dtype.
      thread_local std::vector<float> floats;
      auto dtype = static_cast<images::Dtype>(b.dtype);
      floats.resize(b.images.size() / images::dtypeBytes(dtype));
      images::toFloat(b.images.as<uint8_t>(), dtype, floats);
      r.loss = model->trainStep(floats, b.labels);
    } else if (b.bytes) {
      // One buffer per pool thread: a batch's floats are 400 KB, an mmap and its page faults on
      // every step if allocated each time.
      thread_local std::vector<float> floats;
      floats.resize(b.images.size());
      augment::normalizeImages(b.images.as<uint8_t>(), floats);
      r.loss = model->trainStep(floats, b.labels);
    } else {
      r.loss = model->trainStep(b.images.as<float>(), b.labels);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after);
    b.done->store(true);
    {
      std::lock_guard lock(gaps->mutex);
      gaps->lastEnd = std::chrono::steady_clock::now();
    }
    r.cpuSeconds =
        double(after.tv_sec - before.tv_sec) + 1e-9 * double(after.tv_nsec - before.tv_nsec);
    return r;
  });
}

kj::Promise<double> MlpLearner::evaluate(ActorContext& context, uint32_t) {
  if (!test_) return NAN;  // a dataset without a test set
  return context.offload([model = model_, test = test_]() {
    trace::Span span("eval", "train");
    return model->evaluate(test->images, test->labels);
  });
}

void MlpLearner::load(TrainingState& s, const std::string& name) {
  if (s.parameters.size() != model_->parameterCount() ||
      s.velocities.size() != model_->parameterCount()) {
    throw CheckpointError(name + " holds " + std::to_string(s.parameters.size()) +
                          " parameters and " + std::to_string(s.velocities.size()) +
                          " velocities; the model has " + std::to_string(model_->parameterCount()));
  }
  model_->setParameters(s.parameters);
  model_->setVelocities(s.velocities);
  s.parameters = {};
  s.velocities = {};
}

void MlpLearner::save(TrainingState& state) {
  state.parameters = model_->parameters();
  state.velocities = model_->velocities();
}

Handoffs MlpLearner::handoffs() const {
  std::lock_guard lock(gaps_->mutex);
  return gaps_->total;
}

void MlpLearner::finished(const std::vector<EpochRecord>& history) {
  if (modelDir_.empty()) return;
  model_->save(modelDir_, trainer::ModelInfo{static_cast<int64_t>(history.size()),
                                             history.empty() ? 0 : history.back().accuracy});
  spdlog::info("model saved to {}", modelDir_);
}

std::shared_ptr<Learner> makeMlpLearner(hetero::TrainerArgs::Reader args) {
  return std::make_shared<MlpLearner>(args);
}

}  // namespace troupe::train
