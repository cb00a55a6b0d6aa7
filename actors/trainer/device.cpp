#include <stdexcept>

#include "troupe/trainer/device.h"

#ifdef TROUPE_TRAINER_WITH_CUDA
#include "cuda_device.h"
#endif

namespace troupe::train {

bool builtWithCuda() {
#ifdef TROUPE_TRAINER_WITH_CUDA
  return true;
#else
  return false;
#endif
}

DeviceSelection selectDevice(DeviceKind kind) {
  const char* cpu = "using CPU (Thrust OMP + OpenBLAS)";
  if (kind == DeviceKind::kCpu) return {makeCpuDevice(), std::string(cpu) + ": requested"};
  std::string why;
#ifdef TROUPE_TRAINER_WITH_CUDA
  std::string error;
  if (cudaDeviceCount(error) > 0) {
    auto device = makeCudaDevice(0);
    std::string reason = "using " + device->name() + " (Thrust CUDA + cuBLAS)";
    return {std::move(device), std::move(reason)};
  }
  why = "built with CUDA but cudaGetDeviceCount found no GPU (" + error + ")";
#else
  why = "built without CUDA (nvcc was not found at configure time)";
#endif
  if (kind == DeviceKind::kCuda) throw std::runtime_error("CUDA device requested but " + why);
  return {makeCpuDevice(), std::string(cpu) + ": " + why};
}

}  // namespace troupe::train
