// Private to troupe_trainer: the entry points of troupe_trainer_cuda, which exists only in
// builds with TROUPE_HAVE_CUDA. Kept free of CUDA headers so g++ code can include it.
#pragma once

#include <memory>
#include <string>

#include "troupe/trainer/device.h"

namespace troupe::trainer {

/// Number of CUDA devices; 0 with `error` set when the driver or a GPU is missing.
int cudaDeviceCount(std::string& error);

/// The CUDA back end on device `ordinal` (Thrust CUDA + cuBLAS). Throws std::runtime_error when
/// the device or cuBLAS cannot be initialised.
std::unique_ptr<Device> makeCudaDevice(int ordinal = 0);

}  // namespace troupe::trainer
