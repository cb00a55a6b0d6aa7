#include "troupe/sched/instance_types.h"

#include <algorithm>
#include <array>

namespace troupe::sched {

namespace {

// Public AWS figures (instance specs; SageMaker training on-demand prices, us-east-1). The seed
// experiments quote p4d.24xlarge $37.688, c5.18xlarge $3.672, p3.2xlarge $3.825, c5.9xlarge
// $1.836. Keep sorted by name: lookup is a binary search.
constexpr std::array kTable = {
    InstanceType{"ml.c5.18xlarge", 72, 0, 144, 3.672},
    InstanceType{"ml.c5.2xlarge", 8, 0, 16, 0.408},
    InstanceType{"ml.c5.4xlarge", 16, 0, 32, 0.816},
    InstanceType{"ml.c5.9xlarge", 36, 0, 72, 1.836},
    InstanceType{"ml.c5.xlarge", 4, 0, 8, 0.204},
    InstanceType{"ml.g5.16xlarge", 64, 1, 256, 6.072},
    InstanceType{"ml.g5.48xlarge", 192, 8, 768, 20.36},
    InstanceType{"ml.g5.8xlarge", 32, 1, 128, 3.06},
    InstanceType{"ml.g5.xlarge", 4, 1, 16, 1.408},
    InstanceType{"ml.m4.xlarge", 4, 0, 16, 0.24},
    InstanceType{"ml.m5.xlarge", 4, 0, 16, 0.23},
    InstanceType{"ml.p3.16xlarge", 64, 8, 488, 28.152},
    InstanceType{"ml.p3.2xlarge", 8, 1, 61, 3.825},
    InstanceType{"ml.p3.8xlarge", 32, 4, 244, 14.688},
    InstanceType{"ml.p4d.24xlarge", 96, 8, 1152, 37.688},
    InstanceType{"ml.trn1.32xlarge", 128, 16, 512, 24.725},
};

constexpr bool sortedByName() {
  for (size_t i = 1; i < kTable.size(); ++i) {
    if (!(kTable[i - 1].name < kTable[i].name)) return false;
  }
  return true;
}
static_assert(sortedByName(), "kTable must be sorted by name");

}  // namespace

Resources InstanceType::capacity() const {
  return Resources::of(vcpus, gpus, uint64_t(memoryGib * 1024 * 1024 * 1024));
}

std::optional<InstanceType> findInstanceType(std::string_view name) {
  auto it =
      std::lower_bound(kTable.begin(), kTable.end(), name,
                       [](const InstanceType& row, std::string_view n) { return row.name < n; });
  if (it == kTable.end() || it->name != name) return std::nullopt;
  return *it;
}

std::span<const InstanceType> knownInstanceTypes() {
  return kTable;
}

}  // namespace troupe::sched
