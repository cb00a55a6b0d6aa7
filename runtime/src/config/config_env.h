// Private to runtime/src: what the cluster descriptions built from the environment (Slurm,
// Kubernetes) share: looking variables up, NAME[=COUNT][:TYPE] group lists, and writing the
// description in resourceconfig.json's shape for ClusterConfig::parse().

#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "troupe/config.h"

namespace troupe {

const std::string* findVar(const Environment& env, const std::string& key);
// The value of `key`, or null when it is unset or empty.

struct GroupSpec {
  std::string name, instanceType;
  unsigned count = 0;
};

std::vector<GroupSpec> parseGroupSpecs(const std::string& text, const std::string& what,
                                       bool withCount);
// "data_group=2,dnn_group=1:ml.p3.2xlarge" (withCount) or "data_group,dnn_group:ml.p3.2xlarge".
// Throws ConfigError naming `what`.

nlohmann::json describe(const std::string& currentHost, const std::string& interface,
                        const std::vector<GroupSpec>& specs,
                        const std::vector<std::vector<std::string>>& hostsOf);
// A description with one instance group per spec, holding hostsOf[i].

}  // namespace troupe
