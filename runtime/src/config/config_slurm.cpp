// A cluster description from a Slurm job's environment (clusterFromSlurm in troupe/config.h).

#include "config/config_env.h"

namespace troupe {

std::optional<std::string> clusterFromSlurm(const Environment& env) {
  auto* node = findVar(env, "SLURMD_NODENAME");
  if (node == nullptr) return std::nullopt;
  // Slurm before 20.02 said PACK where it now says HET.
  std::string kind = findVar(env, "SLURM_HET_SIZE")    ? "HET"
                     : findVar(env, "SLURM_PACK_SIZE") ? "PACK"
                                                       : "";
  std::vector<std::string> lists, listVars;
  if (kind.empty()) {
    const std::string* list = findVar(env, "SLURM_JOB_NODELIST");
    listVars.push_back("SLURM_JOB_NODELIST");
    if (list == nullptr) {
      list = findVar(env, "SLURM_NODELIST");
      listVars.back() = "SLURM_NODELIST";
    }
    if (list == nullptr) return std::nullopt;
    lists.push_back(*list);
  } else {
    auto sizeVar = "SLURM_" + kind + "_SIZE";
    auto& sizeText = *findVar(env, sizeVar);
    unsigned size = 0;
    try {
      size_t used = 0;
      size = std::stoul(sizeText, &used);
      if (used != sizeText.size()) size = 0;
    } catch (const std::exception&) {
    }
    if (size == 0 || size > 64) {
      throw ConfigError(sizeVar + " '" + sizeText + "' must be a number of components (1-64)");
    }
    for (unsigned n = 0; n < size; ++n) {
      auto var = "SLURM_JOB_NODELIST_" + kind + "_GROUP_" + std::to_string(n);
      auto* list = findVar(env, var);
      if (list == nullptr) {
        throw ConfigError(sizeVar + " is " + sizeText + " but " + var +
                          " is not set; run the app through srun in the job's every component "
                          "(srun --het-group=0-" +
                          std::to_string(size - 1) + ")");
      }
      lists.push_back(*list);
      listVars.push_back(var);
    }
  }

  std::vector<GroupSpec> specs;
  if (auto* names = findVar(env, "TROUPE_SLURM_GROUPS")) {
    specs = parseGroupSpecs(*names, "TROUPE_SLURM_GROUPS '" + *names + "'", false);
    if (specs.size() != lists.size()) {
      throw ConfigError("TROUPE_SLURM_GROUPS '" + *names + "' names " +
                        std::to_string(specs.size()) + " groups but the job has " +
                        std::to_string(lists.size()) + " component(s); name one per component");
    }
  } else {
    for (size_t n = 0; n < lists.size(); ++n) {
      specs.push_back({kind.empty() ? "slurm" : "het_group_" + std::to_string(n), "", 0});
    }
  }
  std::vector<std::vector<std::string>> hostsOf;
  for (size_t n = 0; n < lists.size(); ++n) {
    hostsOf.push_back(expandHostList(lists[n], listVars[n]));
  }
  auto rc = describe(*node, "", specs, hostsOf);
  return rc.dump();
}

}  // namespace troupe
