#include "troupe/trainer/mlp.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

namespace troupe::trainer {

struct Mlp::Layer {
  int in = 0;
  int out = 0;
  std::unique_ptr<Buffer> w, b;    // in x out, out.
  std::unique_ptr<Buffer> vw, vb;  // Momentum.
  std::unique_ptr<Buffer> gw, gb;  // Last gradients.
};

namespace {

// He-normal initialisation from a portable generator (splitmix64 + Box-Muller), so a seed means
// the same starting weights everywhere.
class InitRandom {
 public:
  explicit InitRandom(uint64_t seed) : state_(seed) {}
  double uniform() { return (next() >> 11) * 0x1.0p-53; }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// Whole or not at all, and never a partial file left behind: model/ is shipped as the job's
// output (SageMaker's model.tar.gz), so a .tmp there would be shipped too.
void writeFileAtomically(const std::filesystem::path& path, const void* data, size_t size) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  auto fail = [&](const char* what, int error) {
    unlink(tmp.c_str());
    throw std::runtime_error(std::string("cannot ") + what + " " + path.string() + ": " +
                             strerror(error));
  };
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", errno);
  auto bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int error = n < 0 ? errno : ENOSPC;
      close(fd);
      fail("write", error);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    int error = errno;
    close(fd);
    fail("sync", error);
  }
  if (close(fd) != 0) fail("write", errno);
  if (rename(tmp.c_str(), path.c_str()) != 0) fail("rename into place", errno);
}

}  // namespace

void MlpConfig::validate() const {
  if (layerSizes.size() < 2) {
    throw std::invalid_argument("MlpConfig.layerSizes has " + std::to_string(layerSizes.size()) +
                                " entries; it needs at least input and output sizes");
  }
  for (size_t i = 0; i < layerSizes.size(); ++i) {
    if (layerSizes[i] <= 0) {
      throw std::invalid_argument("MlpConfig.layerSizes[" + std::to_string(i) + "] is " +
                                  std::to_string(layerSizes[i]) + "; sizes must be positive");
    }
  }
  if (layerSizes.back() > 256) {
    throw std::invalid_argument("MlpConfig.layerSizes ends in " +
                                std::to_string(layerSizes.back()) +
                                " classes; labels are bytes, so at most 256");
  }
  if (!(learningRate > 0)) {
    throw std::invalid_argument("MlpConfig.learningRate is " + std::to_string(learningRate) +
                                "; it must be positive");
  }
  if (!(momentum >= 0 && momentum < 1)) {
    throw std::invalid_argument("MlpConfig.momentum is " + std::to_string(momentum) +
                                "; it must be in [0, 1)");
  }
  if (!(weightDecay >= 0)) {
    throw std::invalid_argument("MlpConfig.weightDecay is " + std::to_string(weightDecay) +
                                "; it must be >= 0");
  }
}

Mlp::Mlp(const MlpConfig& config, std::shared_ptr<Device> device)
    : config_(config), device_(std::move(device)) {
  if (!device_) throw std::invalid_argument("Mlp: no device given");
  config_.validate();
  InitRandom random(config_.seed);
  for (size_t l = 0; l + 1 < config_.layerSizes.size(); ++l) {
    Layer layer;
    layer.in = config_.layerSizes[l];
    layer.out = config_.layerSizes[l + 1];
    const size_t nw = size_t(layer.in) * layer.out;
    std::vector<float> w(nw);
    const double scale = std::sqrt(2.0 / layer.in);
    for (float& x : w) x = float(random.normal() * scale);
    layer.w = device_->allocate(nw);
    device_->upload(w, *layer.w);
    layer.b = device_->allocate(layer.out);
    layer.vw = device_->allocate(nw);
    layer.vb = device_->allocate(layer.out);
    layer.gw = device_->allocate(nw);
    layer.gb = device_->allocate(layer.out);
    layers_.push_back(std::move(layer));
  }
}

Mlp::~Mlp() = default;
Mlp::Mlp(Mlp&&) noexcept = default;
Mlp& Mlp::operator=(Mlp&&) noexcept = default;

size_t Mlp::parameterCount() const {
  size_t n = 0;
  for (const Layer& l : layers_) n += size_t(l.in) * l.out + l.out;
  return n;
}

void Mlp::checkBatch(std::span<const float> inputs, std::span<const uint8_t> labels,
                     const char* what) const {
  if (labels.empty()) throw std::invalid_argument(std::string("Mlp::") + what + ": empty batch");
  if (inputs.size() != labels.size() * inputSize()) {
    throw std::invalid_argument(std::string("Mlp::") + what + ": " + std::to_string(inputs.size()) +
                                " input floats for " + std::to_string(labels.size()) +
                                " labels; expected " + std::to_string(labels.size() * inputSize()) +
                                " (" + std::to_string(inputSize()) + " per sample)");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= classCount()) {
      throw std::invalid_argument(std::string("Mlp::") + what + ": label " + std::to_string(i) +
                                  " is " + std::to_string(labels[i]) + "; the model has " +
                                  std::to_string(classCount()) + " classes");
    }
  }
}

void Mlp::ensureCapacity(size_t rows) {
  if (rows <= capacity_) return;
  acts_.clear();
  deltas_.clear();
  for (int size : config_.layerSizes) {
    acts_.push_back(device_->allocate(rows * size));
    deltas_.push_back(device_->allocate(rows * size));
  }
  ones_ = device_->allocate(rows);
  device_->upload(std::vector<float>(rows, 1.0f), *ones_);
  capacity_ = rows;
}

void Mlp::forward(std::span<const float> inputs, int rows) {
  ensureCapacity(rows);
  input_ = &device_->input(inputs, *acts_[0]);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    device_->gemm(false, false, rows, layer.out, layer.in, 1.0f, l == 0 ? *input_ : *acts_[l],
                  *layer.w, 0.0f, *acts_[l + 1]);
    device_->addRowVector(rows, layer.out, *layer.b, *acts_[l + 1]);
    if (l + 1 < layers_.size()) device_->relu(size_t(rows) * layer.out, *acts_[l + 1]);
  }
}

// Expects deltas_.back() to hold d loss / d logits.
void Mlp::backward(int rows) {
  for (size_t l = layers_.size(); l-- > 0;) {
    Layer& layer = layers_[l];
    device_->gemm(true, false, layer.in, layer.out, rows, 1.0f, l == 0 ? *input_ : *acts_[l],
                  *deltas_[l + 1], 0.0f, *layer.gw);
    device_->gemm(false, false, 1, layer.out, rows, 1.0f, *ones_, *deltas_[l + 1], 0.0f, *layer.gb);
    if (l == 0) break;  // No gradient needed for the inputs.
    device_->gemm(false, true, rows, layer.in, layer.out, 1.0f, *deltas_[l + 1], *layer.w, 0.0f,
                  *deltas_[l]);
    // acts_[l] is the ReLU output; positive exactly where the pre-activation was.
    device_->reluBackward(size_t(rows) * layer.in, *acts_[l], *deltas_[l]);
  }
}

float Mlp::computeGradients(std::span<const float> inputs, std::span<const uint8_t> labels) {
  checkBatch(inputs, labels, "computeGradients");
  const int rows = int(labels.size());
  forward(inputs, rows);
  const float loss =
      device_->softmaxCrossEntropy(rows, classCount(), *acts_.back(), labels, deltas_.back().get());
  backward(rows);
  return loss;
}

float Mlp::trainStep(std::span<const float> inputs, std::span<const uint8_t> labels) {
  const float loss = computeGradients(inputs, labels);
  for (Layer& layer : layers_) {
    device_->sgdMomentum(size_t(layer.in) * layer.out, config_.learningRate, config_.momentum,
                         config_.weightDecay, *layer.gw, *layer.vw, *layer.w);
    device_->sgdMomentum(layer.out, config_.learningRate, config_.momentum, 0.0f, *layer.gb,
                         *layer.vb, *layer.b);
  }
  return loss;
}

float Mlp::loss(std::span<const float> inputs, std::span<const uint8_t> labels) {
  checkBatch(inputs, labels, "loss");
  const int rows = int(labels.size());
  forward(inputs, rows);
  return device_->softmaxCrossEntropy(rows, classCount(), *acts_.back(), labels, nullptr);
}

double Mlp::evaluate(std::span<const float> inputs, std::span<const uint8_t> labels,
                     size_t batchSize) {
  checkBatch(inputs, labels, "evaluate");
  if (batchSize == 0) throw std::invalid_argument("Mlp::evaluate: batchSize is 0");
  size_t correct = 0;
  for (size_t begin = 0; begin < labels.size(); begin += batchSize) {
    const size_t rows = std::min(batchSize, labels.size() - begin);
    forward(inputs.subspan(begin * inputSize(), rows * inputSize()), int(rows));
    correct +=
        device_->countCorrect(int(rows), classCount(), *acts_.back(), labels.subspan(begin, rows));
  }
  return double(correct) / labels.size();
}

std::vector<float> Mlp::parameters() const {
  std::vector<float> out(parameterCount());
  size_t at = 0;
  for (const Layer& l : layers_) {
    const size_t nw = size_t(l.in) * l.out;
    device_->download(*l.w, std::span(out).subspan(at, nw));
    device_->download(*l.b, std::span(out).subspan(at + nw, l.out));
    at += nw + l.out;
  }
  return out;
}

std::vector<float> Mlp::gradients() const {
  std::vector<float> out(parameterCount());
  size_t at = 0;
  for (const Layer& l : layers_) {
    const size_t nw = size_t(l.in) * l.out;
    device_->download(*l.gw, std::span(out).subspan(at, nw));
    device_->download(*l.gb, std::span(out).subspan(at + nw, l.out));
    at += nw + l.out;
  }
  return out;
}

void Mlp::setParameters(std::span<const float> values) {
  if (values.size() != parameterCount()) {
    throw std::invalid_argument("Mlp::setParameters: " + std::to_string(values.size()) +
                                " values for " + std::to_string(parameterCount()) + " parameters");
  }
  size_t at = 0;
  for (Layer& l : layers_) {
    const size_t nw = size_t(l.in) * l.out;
    device_->upload(values.subspan(at, nw), *l.w);
    device_->upload(values.subspan(at + nw, l.out), *l.b);
    at += nw + l.out;
  }
}

std::vector<float> Mlp::velocities() const {
  std::vector<float> out(parameterCount());
  size_t at = 0;
  for (const Layer& l : layers_) {
    const size_t nw = size_t(l.in) * l.out;
    device_->download(*l.vw, std::span(out).subspan(at, nw));
    device_->download(*l.vb, std::span(out).subspan(at + nw, l.out));
    at += nw + l.out;
  }
  return out;
}

void Mlp::setVelocities(std::span<const float> values) {
  if (values.size() != parameterCount()) {
    throw std::invalid_argument("Mlp::setVelocities: " + std::to_string(values.size()) +
                                " values for " + std::to_string(parameterCount()) + " parameters");
  }
  size_t at = 0;
  for (Layer& l : layers_) {
    const size_t nw = size_t(l.in) * l.out;
    device_->upload(values.subspan(at, nw), *l.vw);
    device_->upload(values.subspan(at + nw, l.out), *l.vb);
    at += nw + l.out;
  }
}

void Mlp::save(const std::filesystem::path& dir, const ModelInfo& info) const {
  static_assert(std::endian::native == std::endian::little, "model.bin is little-endian");
  std::filesystem::create_directories(dir);
  const std::vector<float> params = parameters();
  writeFileAtomically(dir / "model.bin", params.data(), params.size() * sizeof(float));
  nlohmann::json header = {
      {"format", "troupe-mlp"},
      {"version", 1},
      {"layerSizes", config_.layerSizes},
      {"activation", "relu"},
      {"output", "softmax"},
      {"parameterCount", params.size()},
      {"weightsFile", "model.bin"},
      {"weightsLayout", "per layer: W (in x out, row-major) then b (out); float32 little-endian"},
      {"epoch", info.epoch},
      {"accuracy", info.accuracy},
  };
  const std::string text = header.dump(2) + "\n";
  writeFileAtomically(dir / "model.json", text.data(), text.size());
}

Mlp Mlp::load(const std::filesystem::path& dir, std::shared_ptr<Device> device, ModelInfo* info,
              MlpConfig config) {
  const std::filesystem::path jsonPath = dir / "model.json";
  std::ifstream in(jsonPath);
  if (!in) throw std::runtime_error(jsonPath.string() + ": cannot open");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(in);
    if (header.at("format") != "troupe-mlp" || header.at("version") != 1) {
      throw std::runtime_error("format is " + header.at("format").dump() + " version " +
                               header.at("version").dump() + ", expected \"troupe-mlp\" 1");
    }
    config.layerSizes = header.at("layerSizes").get<std::vector<int>>();
  } catch (const std::exception& e) {
    throw std::runtime_error(jsonPath.string() + ": " + e.what());
  }
  Mlp mlp(config, std::move(device));
  const std::filesystem::path binPath = dir / header.value("weightsFile", "model.bin");
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(binPath, ec);
  if (ec || bytes != mlp.parameterCount() * sizeof(float)) {
    throw std::runtime_error(binPath.string() + " has " + (ec ? "no" : std::to_string(bytes)) +
                             " bytes; layer sizes in model.json need " +
                             std::to_string(mlp.parameterCount() * sizeof(float)));
  }
  std::vector<float> params(mlp.parameterCount());
  std::ifstream bin(binPath, std::ios::binary);
  bin.read(reinterpret_cast<char*>(params.data()), std::streamsize(bytes));
  if (!bin) throw std::runtime_error(binPath.string() + ": read failed");
  mlp.setParameters(params);
  if (info) {
    info->epoch = header.value("epoch", int64_t(0));
    info->accuracy = header.value("accuracy", 0.0);
  }
  return mlp;
}

}  // namespace troupe::trainer
