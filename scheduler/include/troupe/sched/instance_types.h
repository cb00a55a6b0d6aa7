// File: troupe/sched/instance_types.h
//
// The one table of known instance sizes (SageMaker ML instance types). Node capacity defaults to
// the row of its instance type; a node may override it (bare metal, `troupe sim` CPU sets).

#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "troupe/sched/resources.h"

namespace troupe::sched {

/// One row of the table: public AWS figures (vCPUs, GPUs or accelerators, memory, on-demand
/// price per hour in us-east-1 for SageMaker training).
struct InstanceType {
  std::string_view name;  // "ml.p3.2xlarge"
  uint32_t vcpus;
  uint32_t gpus;  // NVIDIA GPUs; for Trainium the count of Neuron devices
  double memoryGib;
  double pricePerHour;  // USD

  /// The capacity a node of this type offers: vcpus cpus, gpus gpus, memory in bytes.
  Resources capacity() const;
};

/// The row for `name` ("ml.c5.9xlarge"), or nothing for a type not in the table.
std::optional<InstanceType> findInstanceType(std::string_view name);

/// Every row, sorted by name.
std::span<const InstanceType> knownInstanceTypes();

}  // namespace troupe::sched
