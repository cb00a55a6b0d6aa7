// Private to troupe_trainer. The Device operations other than gemm, written once over Thrust and
// compiled twice: by g++ with THRUST_DEVICE_SYSTEM=OMP (cpu_device.cpp) and by nvcc for CUDA
// (cuda_device.cu). Everything here sits in an unnamed namespace because the two compilations
// see different Thrust versions and must never share a symbol. Functors rather than lambdas so
// nvcc needs no --extended-lambda.

#pragma once

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/reduce.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <math.h>

#include <stdexcept>
#include <string>

#include "troupe/trainer/device.h"

namespace troupe::trainer {
namespace {

struct ReluOp {
  __host__ __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};

struct ReluBackwardOp {
  __host__ __device__ float operator()(float activation, float grad) const {
    return activation > 0.0f ? grad : 0.0f;
  }
};

struct AddRowVectorOp {
  float* m;
  const float* v;
  size_t cols;
  __host__ __device__ void operator()(size_t i) const { m[i] += v[i % cols]; }
};

// One row per call: rows are only `cols` (10) wide, so a thread per row is plenty.
struct SoftmaxCrossEntropyRow {
  const float* logits;
  const uint8_t* labels;
  float* gradient;  // May be null.
  float* rowLoss;
  int cols;
  float invRows;
  __host__ __device__ void operator()(int r) const {
    const float* z = logits + size_t(r) * cols;
    float maxZ = z[0];
    for (int j = 1; j < cols; ++j) maxZ = z[j] > maxZ ? z[j] : maxZ;
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) sum += expf(z[j] - maxZ);
    const int label = labels[r];
    rowLoss[r] = logf(sum) - (z[label] - maxZ);
    if (gradient == nullptr) return;
    float* g = gradient + size_t(r) * cols;
    for (int j = 0; j < cols; ++j) {
      g[j] = (expf(z[j] - maxZ) / sum - (j == label ? 1.0f : 0.0f)) * invRows;
    }
  }
};

struct CorrectRow {
  const float* logits;
  const uint8_t* labels;
  int cols;
  __host__ __device__ size_t operator()(int r) const {
    const float* z = logits + size_t(r) * cols;
    int best = 0;
    for (int j = 1; j < cols; ++j) best = z[j] > z[best] ? j : best;
    return best == labels[r] ? 1 : 0;
  }
};

struct SgdMomentumOp {
  float* weights;
  float* velocity;
  const float* grad;
  float learningRate, momentum, weightDecay;
  __host__ __device__ void operator()(size_t i) const {
    const float v = momentum * velocity[i] - learningRate * (grad[i] + weightDecay * weights[i]);
    velocity[i] = v;
    weights[i] += v;
  }
};

/// A Buffer backed by a Thrust device_vector of whichever device system this TU compiles for.
class ThrustBuffer final : public Buffer {
 public:
  explicit ThrustBuffer(size_t count) : data(count, 0.0f) {}
  size_t size() const override { return data.size(); }
  thrust::device_vector<float> data;
};

/// Everything but gemm and name; the back ends add those.
class ThrustDevice : public Device {
 public:
  std::unique_ptr<Buffer> allocate(size_t count) override {
    return std::make_unique<ThrustBuffer>(count);
  }

  void upload(std::span<const float> host, Buffer& dst) override {
    auto& d = cast(dst);
    requireSize(d, host.size(), "upload");
    thrust::copy(host.data(), host.data() + host.size(), d.data.begin());
  }

  void download(const Buffer& src, std::span<float> host) override {
    auto& s = cast(src);
    requireSize(s, host.size(), "download");
    thrust::copy(s.data.begin(), s.data.begin() + host.size(), host.data());
  }

  void addRowVector(int rows, int cols, const Buffer& v, Buffer& m) override {
    const size_t n = size_t(rows) * cols;
    requireSize(cast(m), n, "addRowVector");
    thrust::for_each(thrust::device, thrust::counting_iterator<size_t>(0),
                     thrust::counting_iterator<size_t>(n),
                     AddRowVectorOp{raw(m), raw(v), size_t(cols)});
  }

  void relu(size_t count, Buffer& x) override {
    auto& d = cast(x);
    requireSize(d, count, "relu");
    thrust::transform(d.data.begin(), d.data.begin() + count, d.data.begin(), ReluOp{});
  }

  void reluBackward(size_t count, const Buffer& activation, Buffer& grad) override {
    auto& a = cast(activation);
    auto& g = cast(grad);
    requireSize(a, count, "reluBackward");
    requireSize(g, count, "reluBackward");
    thrust::transform(a.data.begin(), a.data.begin() + count, g.data.begin(), g.data.begin(),
                      ReluBackwardOp{});
  }

  float softmaxCrossEntropy(int rows, int cols, const Buffer& logits,
                            std::span<const uint8_t> labels, Buffer* gradient) override {
    requireSize(cast(logits), size_t(rows) * cols, "softmaxCrossEntropy");
    if (gradient) requireSize(cast(*gradient), size_t(rows) * cols, "softmaxCrossEntropy");
    uploadLabels(labels);
    if (rowLoss_.size() < size_t(rows)) rowLoss_.resize(rows);
    thrust::for_each(
        thrust::device, thrust::counting_iterator<int>(0), thrust::counting_iterator<int>(rows),
        SoftmaxCrossEntropyRow{raw(logits), thrust::raw_pointer_cast(labels_.data()),
                               gradient ? raw(*gradient) : nullptr,
                               thrust::raw_pointer_cast(rowLoss_.data()), cols, 1.0f / rows});
    return thrust::reduce(rowLoss_.begin(), rowLoss_.begin() + rows, 0.0f) / rows;
  }

  size_t countCorrect(int rows, int cols, const Buffer& logits,
                      std::span<const uint8_t> labels) override {
    requireSize(cast(logits), size_t(rows) * cols, "countCorrect");
    uploadLabels(labels);
    return thrust::transform_reduce(
        thrust::device, thrust::counting_iterator<int>(0), thrust::counting_iterator<int>(rows),
        CorrectRow{raw(logits), thrust::raw_pointer_cast(labels_.data()), cols}, size_t(0),
        thrust::plus<size_t>());
  }

  void sgdMomentum(size_t count, float learningRate, float momentum, float weightDecay,
                   const Buffer& grad, Buffer& velocity, Buffer& weights) override {
    requireSize(cast(weights), count, "sgdMomentum");
    requireSize(cast(velocity), count, "sgdMomentum");
    requireSize(cast(grad), count, "sgdMomentum");
    thrust::for_each(
        thrust::device, thrust::counting_iterator<size_t>(0),
        thrust::counting_iterator<size_t>(count),
        SgdMomentumOp{raw(weights), raw(velocity), raw(grad), learningRate, momentum, weightDecay});
  }

 protected:
  // A Buffer from another Device is a caller bug; say so instead of corrupting memory.
  static const ThrustBuffer& cast(const Buffer& b) {
    auto* t = dynamic_cast<const ThrustBuffer*>(&b);
    if (!t) throw std::logic_error("Buffer was allocated by a different Device");
    return *t;
  }
  static ThrustBuffer& cast(Buffer& b) {
    return const_cast<ThrustBuffer&>(cast(static_cast<const Buffer&>(b)));
  }
  static float* raw(Buffer& b) { return thrust::raw_pointer_cast(cast(b).data.data()); }
  static const float* raw(const Buffer& b) { return thrust::raw_pointer_cast(cast(b).data.data()); }
  static void requireSize(const ThrustBuffer& b, size_t needed, const char* op) {
    if (b.size() < needed) {
      throw std::logic_error(std::string("Device::") + op + ": buffer of " +
                             std::to_string(b.size()) + " floats, need " + std::to_string(needed));
    }
  }

 private:
  void uploadLabels(std::span<const uint8_t> labels) {
    labels_.assign(labels.begin(), labels.end());
  }

  thrust::device_vector<uint8_t> labels_;  // Scratch, reused between calls.
  thrust::device_vector<float> rowLoss_;
};

}  // namespace
}  // namespace troupe::trainer
