// The CPU back end: compiled with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (see
// CMakeLists.txt), so thrust::device_vector lives in host memory and algorithms run on OpenMP.
#include <cblas.h>

#include "thrust_device.h"

namespace troupe::trainer {
namespace {

class CpuDevice final : public ThrustDevice {
 public:
  std::string name() const override { return "cpu"; }

  // The batch stays where it lies (on the trainer, in the received message): OpenBLAS reads it
  // there.
  const Buffer& input(std::span<const float> host, Buffer&) override {
    view_.host = host;
    return view_;
  }

  void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const Buffer& a,
            const Buffer& b, float beta, Buffer& c) override {
    const float* pa = operand(a, size_t(m) * k);
    requireSize(cast(b), size_t(k) * n, "gemm");
    requireSize(cast(c), size_t(m) * n, "gemm");
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, pa, transA ? m : k, raw(b),
                transB ? k : n, beta, raw(c), n);
  }

 private:
  struct HostView final : Buffer {
    std::span<const float> host;
    size_t size() const override { return host.size(); }
  };
  HostView view_;

  const float* operand(const Buffer& a, size_t needed) {
    if (&a == &view_) {
      if (view_.host.size() < needed) {
        throw std::logic_error("Device::gemm: input of " + std::to_string(view_.host.size()) +
                               " floats, need " + std::to_string(needed));
      }
      return view_.host.data();
    }
    requireSize(cast(a), needed, "gemm");
    return raw(a);
  }
};

}  // namespace

std::unique_ptr<Device> makeCpuDevice() {
  return std::make_unique<CpuDevice>();
}

}  // namespace troupe::trainer
