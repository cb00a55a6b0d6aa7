// File: troupe/trainer/mlp.h
//
// A multilayer perceptron classifier (default 784-512-256-10): dense layers with ReLU between
// them, softmax cross-entropy loss, SGD with momentum. Written once against Device (device.h),
// so the same code trains on the CPU and on a GPU.
//
// Parameters are laid out, for gradient checks and for the saved weights file, layer by layer:
// W (inputs x outputs, row-major) then b (outputs), float32.

#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "troupe/trainer/device.h"

namespace troupe::trainer {

/// Shape and optimiser settings. validate() reports bad values.
struct MlpConfig {
  std::vector<int> layerSizes = {784, 512, 256, 10};  ///< Input, hidden..., classes (<= 256).
  float learningRate = 0.02f;
  float momentum = 0.9f;
  float weightDecay = 0.0f;  ///< L2 on weights (not biases), added to the gradient.
  uint64_t seed = 1;         ///< Seeds the He-normal weight initialisation.

  /// Throws std::invalid_argument naming the bad field and value.
  void validate() const;
};

/// What is saved next to the weights besides the shape.
struct ModelInfo {
  int64_t epoch = 0;      ///< Epochs trained.
  double accuracy = 0.0;  ///< Test accuracy at save time, in [0, 1].
};

/// The model plus its optimiser state and scratch buffers, all on one Device.
class Mlp {
 public:
  /// Initialises weights (He normal from config.seed, zero biases) on `device`. The Mlp shares
  /// ownership of the device: a training step running on a pool thread keeps both alive, however
  /// early the actor that made them goes away. Throws std::invalid_argument on a bad config.
  Mlp(const MlpConfig& config, std::shared_ptr<Device> device);
  ~Mlp();
  Mlp(Mlp&&) noexcept;
  Mlp& operator=(Mlp&&) noexcept;

  /// One SGD step on a batch: `inputs` is labels.size() rows of inputSize() floats. Returns the
  /// batch's mean cross-entropy before the update. Throws std::invalid_argument when the sizes do
  /// not match or a label is >= classCount().
  float trainStep(std::span<const float> inputs, std::span<const uint8_t> labels);

  /// Forward and backward without updating: returns the mean loss and leaves the gradients
  /// readable through gradients(). For gradient checks.
  float computeGradients(std::span<const float> inputs, std::span<const uint8_t> labels);

  /// Mean cross-entropy on a batch, no gradients.
  float loss(std::span<const float> inputs, std::span<const uint8_t> labels);

  /// Fraction of `inputs` whose arg-max class equals the label, in chunks of `batchSize` rows.
  double evaluate(std::span<const float> inputs, std::span<const uint8_t> labels,
                  size_t batchSize = 1000);

  /// Copies of all parameters / of the last gradients, in the layout described above.
  std::vector<float> parameters() const;
  std::vector<float> gradients() const;
  /// Replaces all parameters (size must be parameterCount()).
  void setParameters(std::span<const float> values);
  /// The optimiser's state: the momentum (velocity) of every parameter, in the same layout. With
  /// parameters() it is everything a checkpoint needs to continue training exactly where it was.
  std::vector<float> velocities() const;
  /// Replaces the momentum of every parameter (size must be parameterCount()).
  void setVelocities(std::span<const float> values);

  size_t parameterCount() const;
  int inputSize() const { return config_.layerSizes.front(); }
  int classCount() const { return config_.layerSizes.back(); }
  const MlpConfig& config() const { return config_; }
  /// For schedules; takes effect at the next step.
  void setLearningRate(float learningRate) { config_.learningRate = learningRate; }
  Device& device() const { return *device_; }

  /// Writes `dir`/model.bin (parameters, float32 little-endian) and `dir`/model.json (format,
  /// layer sizes, epoch, accuracy, parameter count), creating `dir`. Each file is written to a
  /// temporary name and renamed, so a crash never leaves a half-written model.
  void save(const std::filesystem::path& dir, const ModelInfo& info) const;

  /// Reads a model written by save() onto `device`; the optimiser settings come from `config`
  /// except layerSizes, which come from the file. Throws std::runtime_error naming the file
  /// and the mismatching values.
  static Mlp load(const std::filesystem::path& dir, std::shared_ptr<Device> device,
                  ModelInfo* info = nullptr, MlpConfig config = {});

 private:
  struct Layer;
  void checkBatch(std::span<const float> inputs, std::span<const uint8_t> labels,
                  const char* what) const;
  void ensureCapacity(size_t rows);
  void forward(std::span<const float> inputs, int rows);
  void backward(int rows);

  MlpConfig config_;
  std::shared_ptr<Device> device_;
  std::vector<Layer> layers_;
  size_t capacity_ = 0;                          // Rows the scratch buffers hold.
  std::vector<std::unique_ptr<Buffer>> acts_;    // acts_[0] input, acts_[l + 1] layer l output.
  const Buffer* input_ = nullptr;  // what layer 0 reads: acts_[0], or the batch where it lies
  std::vector<std::unique_ptr<Buffer>> deltas_;  // d loss / d acts_[l], same shapes.
  std::unique_ptr<Buffer> ones_;                 // capacity_ ones: bias gradient as a gemm.
};

}  // namespace troupe::trainer
