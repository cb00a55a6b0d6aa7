// The CPU back end: compiled with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (see
// CMakeLists.txt), so thrust::device_vector lives in host memory and algorithms run on OpenMP.
#include <cblas.h>

#include "thrust_device.h"

namespace troupe::train {
namespace {

class CpuDevice final : public ThrustDevice {
 public:
  std::string name() const override { return "cpu"; }

  void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const Buffer& a,
            const Buffer& b, float beta, Buffer& c) override {
    requireSize(cast(a), size_t(m) * k, "gemm");
    requireSize(cast(b), size_t(k) * n, "gemm");
    requireSize(cast(c), size_t(m) * n, "gemm");
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, raw(a), transA ? m : k, raw(b),
                transB ? k : n, beta, raw(c), n);
  }
};

}  // namespace

std::unique_ptr<Device> makeCpuDevice() {
  return std::make_unique<CpuDevice>();
}

}  // namespace troupe::train
