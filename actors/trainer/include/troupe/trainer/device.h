// File: troupe/trainer/device.h
//
// The seam between the model and the hardware. The MLP (mlp.h) is written once against Device;
// a Device owns float buffers and runs the few operations an MLP needs on them: a matrix
// multiply and a handful of elementwise/row-wise kernels. Two implementations exist:
//
//   * CPU: Thrust on its OpenMP back end for the elementwise work, OpenBLAS cblas_sgemm;
//   * CUDA (only in builds with TROUPE_HAVE_CUDA): Thrust on its CUDA back end and cuBLAS.
//
// Both are the same Thrust code compiled twice, so the two paths cannot drift apart. Thrust
// types stay out of this header: the two back ends see different Thrust versions (Debian's for
// g++, CUDA's CCCL for nvcc), and callers should not have to care.
//
// All matrices are row-major. Sizes are passed explicitly because buffers are sized for the
// largest batch and reused for smaller ones.

#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace troupe::trainer {

/// Memory on a Device, `size()` floats. Only the Device that allocated it may use it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t size() const = 0;
};

/// Compute back end for the MLP. Not thread-safe: one trainer thread owns a Device. Operations
/// may run asynchronously on the device; download, softmaxCrossEntropy and countCorrect wait.
class Device {
 public:
  virtual ~Device() = default;

  /// Short name for logs: "cpu" or "cuda:<n> <gpu name>".
  virtual std::string name() const = 0;

  /// A zero-filled buffer of `count` floats.
  virtual std::unique_ptr<Buffer> allocate(size_t count) = 0;
  /// Copies `host` into the start of `dst` (which must be at least as large).
  virtual void upload(std::span<const float> host, Buffer& dst) = 0;
  /// Copies the first `host.size()` floats of `src` to `host`.
  virtual void download(const Buffer& src, std::span<float> host) = 0;
  /// A batch in host memory as an operand (gemm's `a`): on a device that computes in host memory,
  /// a view of `host` itself, valid while `host` is and until the next input() (no copy: the
  /// trainer steps straight from the received message); elsewhere `host` uploaded into
  /// `staging`, which must be large enough. The default uploads.
  virtual const Buffer& input(std::span<const float> host, Buffer& staging) {
    upload(host, staging);
    return staging;
  }

  /// C = alpha * op(A) * op(B) + beta * C, with op(A) m x k, op(B) k x n, C m x n, row-major;
  /// op(X) is X transposed when the flag is set (A is then stored k x m, B n x k).
  virtual void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const Buffer& a,
                    const Buffer& b, float beta, Buffer& c) = 0;

  /// Adds row vector `v` (cols) to every row of `m` (rows x cols): the bias of a dense layer.
  virtual void addRowVector(int rows, int cols, const Buffer& v, Buffer& m) = 0;
  /// x = max(x, 0) on the first `count` floats.
  virtual void relu(size_t count, Buffer& x) = 0;
  /// grad = activation > 0 ? grad : 0 on the first `count` floats (ReLU backward, given outputs).
  virtual void reluBackward(size_t count, const Buffer& activation, Buffer& grad) = 0;

  /// Mean softmax cross-entropy of `logits` (rows x cols) against `labels` (rows class ids,
  /// each < cols; the caller checks). If `gradient` is not null it receives d(mean loss)/d(logits),
  /// i.e. (softmax - onehot) / rows.
  virtual float softmaxCrossEntropy(int rows, int cols, const Buffer& logits,
                                    std::span<const uint8_t> labels, Buffer* gradient) = 0;
  /// How many rows of `logits` have their maximum at the label.
  virtual size_t countCorrect(int rows, int cols, const Buffer& logits,
                              std::span<const uint8_t> labels) = 0;

  /// SGD with momentum on the first `count` floats:
  ///   velocity = momentum * velocity - learningRate * (grad + weightDecay * weights)
  ///   weights += velocity
  virtual void sgdMomentum(size_t count, float learningRate, float momentum, float weightDecay,
                           const Buffer& grad, Buffer& velocity, Buffer& weights) = 0;
};

/// The CPU back end (Thrust OMP + OpenBLAS). Uses OpenMP's and OpenBLAS's default thread counts
/// (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS).
std::unique_ptr<Device> makeCpuDevice();

/// True when this build contains the CUDA back end (nvcc was found at configure time).
bool builtWithCuda();

/// Which back end selectDevice should return.
enum class DeviceKind {
  kAuto,  ///< CUDA if built with it and a GPU is present, else CPU.
  kCpu,   ///< Always the CPU.
  kCuda,  ///< CUDA or an exception saying why not.
};

/// A chosen Device and a one-line explanation of the choice for the caller to log once, e.g.
/// "using CPU (Thrust OMP + OpenBLAS): built with CUDA but cudaGetDeviceCount found no GPU
/// (no CUDA-capable device is detected)".
struct DeviceSelection {
  std::unique_ptr<Device> device;
  std::string reason;
};

/// Picks a back end as described by `kind`. Throws std::runtime_error for kCuda when the build
/// has no CUDA or no GPU is present, with the reason.
DeviceSelection selectDevice(DeviceKind kind = DeviceKind::kAuto);

}  // namespace troupe::trainer
