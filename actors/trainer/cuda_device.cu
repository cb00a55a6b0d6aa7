// The CUDA back end: the shared Thrust code on Thrust's CUDA system, plus cuBLAS for gemm.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_device.h"
#include "thrust_device.h"

namespace troupe::trainer {
namespace {

void checkCuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

void checkCublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(status)));
  }
}

class CudaDevice final : public ThrustDevice {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    checkCuda(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp prop{};
    checkCuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    gpuName_ = prop.name;
    checkCublas(cublasCreate(&handle_), "cublasCreate");
  }
  ~CudaDevice() override { cublasDestroy(handle_); }

  std::string name() const override { return "cuda:" + std::to_string(ordinal_) + " " + gpuName_; }

  // cuBLAS is column-major; a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
  // so swap the operands and the m/n roles instead of transposing anything.
  void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const Buffer& a,
            const Buffer& b, float beta, Buffer& c) override {
    requireSize(cast(a), size_t(m) * k, "gemm");
    requireSize(cast(b), size_t(k) * n, "gemm");
    requireSize(cast(c), size_t(m) * n, "gemm");
    checkCublas(cublasSgemm(handle_, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                            transA ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, raw(b),
                            transB ? k : n, raw(a), transA ? m : k, &beta, raw(c), n),
                "cublasSgemm");
  }

 private:
  int ordinal_;
  std::string gpuName_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

int cudaDeviceCount(std::string& error) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    error = cudaGetErrorString(status);
    return 0;
  }
  if (count == 0) error = "no CUDA device";
  return count;
}

std::unique_ptr<Device> makeCudaDevice(int ordinal) {
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace troupe::trainer
