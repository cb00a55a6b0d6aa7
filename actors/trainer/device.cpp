#include <cstdlib>
#include <stdexcept>
#include <string>

#include <strings.h>

#include "troupe/trainer/device.h"

#ifdef TROUPE_TRAINER_WITH_CUDA
#include "cuda_device.h"
#endif

namespace troupe::trainer {
namespace {

// libgomp reads OMP_WAIT_POLICY once at load, so the library cannot fix this itself; the
// process that starts the trainer has to. Measured: 73 ms vs 15 ms per 128-image step on 2 cores.
std::string cpuWaitPolicyNote() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (policy && strcasecmp(policy, "passive") == 0) return "";
  return "; OMP_WAIT_POLICY is not 'passive': idle OpenMP threads will spin and slow OpenBLAS "
         "down (up to 5x measured on 2 cores); set OMP_WAIT_POLICY=passive for the trainer";
}

}  // namespace

bool builtWithCuda() {
#ifdef TROUPE_TRAINER_WITH_CUDA
  return true;
#else
  return false;
#endif
}

DeviceSelection selectDevice(DeviceKind kind) {
  const char* cpu = "using CPU (Thrust OMP + OpenBLAS)";
  if (kind == DeviceKind::kCpu) {
    return {makeCpuDevice(), std::string(cpu) + ": requested" + cpuWaitPolicyNote()};
  }
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
  why = "built without CUDA (no nvcc, or no GPU at configure time: -DTROUPE_CUDA=ON builds it)";
#endif
  if (kind == DeviceKind::kCuda) throw std::runtime_error("CUDA device requested but " + why);
  return {makeCpuDevice(), std::string(cpu) + ": " + why + cpuWaitPolicyNote()};
}

}  // namespace troupe::trainer
