// A cluster description from a Kubernetes pod's environment (clusterFromK8s in troupe/config.h).

#include <algorithm>

#include "config/config_env.h"

namespace troupe {

std::optional<std::string> clusterFromK8s(const Environment& env) {
  auto* groupsText = findVar(env, "TROUPE_K8S_GROUPS");
  if (groupsText == nullptr) return std::nullopt;
  auto what = "TROUPE_K8S_GROUPS '" + *groupsText + "'";
  auto specs = parseGroupSpecs(*groupsText, what, true);
  auto* svc = findVar(env, "TROUPE_K8S_SERVICE");
  std::string service = svc ? *svc : "troupe";
  auto* pod = findVar(env, "TROUPE_POD_NAME");
  if (pod == nullptr) pod = findVar(env, "HOSTNAME");
  if (pod == nullptr) {
    throw ConfigError(
        "TROUPE_K8S_GROUPS is set but neither TROUPE_POD_NAME nor HOSTNAME is; set "
        "TROUPE_POD_NAME from the pod's metadata.name");
  }
  std::vector<std::vector<std::string>> hostsOf;
  std::string current, podNames;
  for (auto& g : specs) {
    std::string prefix = g.name;
    std::replace(prefix.begin(), prefix.end(), '_', '-');
    std::transform(prefix.begin(), prefix.end(), prefix.begin(), ::tolower);
    std::vector<std::string> hosts;
    for (unsigned i = 0; i < g.count; ++i) {
      auto name = prefix + "-" + std::to_string(i);
      if (name == *pod) current = name + "." + service;
      hosts.push_back(name + "." + service);
    }
    hostsOf.push_back(hosts);
    if (!podNames.empty()) podNames += ", ";
    podNames += prefix + "-0.." + std::to_string(g.count - 1);
  }
  if (current.empty()) {
    throw ConfigError("pod '" + *pod + "' is none of the pods " + what + " describes (" + podNames +
                      "); check the StatefulSet/Job names and replica counts");
  }
  return describe(current, "eth0", specs, hostsOf).dump();
}

}  // namespace troupe
