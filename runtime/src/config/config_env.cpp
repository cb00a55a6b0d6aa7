#include "config/config_env.h"

#include <string.h>

#include <algorithm>
#include <sstream>

extern char** environ;

namespace troupe {

using nlohmann::json;

Environment processEnvironment() {
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq != nullptr) env.emplace(std::string(*e, eq - *e), eq + 1);
  }
  return env;
}

const std::string* findVar(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

nlohmann::json describe(const std::string& currentHost, const std::string& interface,
                        const std::vector<GroupSpec>& specs,
                        const std::vector<std::vector<std::string>>& hostsOf) {
  json groups = json::array();
  std::vector<std::string> all;
  std::string currentGroup, currentType;
  for (size_t i = 0; i < specs.size(); ++i) {
    groups.push_back({{"instance_group_name", specs[i].name},
                      {"instance_type", specs[i].instanceType},
                      {"hosts", hostsOf[i]}});
    for (auto& h : hostsOf[i]) {
      all.push_back(h);
      if (h == currentHost) {
        currentGroup = specs[i].name;
        currentType = specs[i].instanceType;
      }
    }
  }
  // A host in two groups stays listed once, so that parse() names both groups.
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  json rc = {{"current_host", currentHost}, {"hosts", all}, {"instance_groups", groups}};
  if (!currentGroup.empty()) rc["current_group_name"] = currentGroup;
  if (!currentType.empty()) rc["current_instance_type"] = currentType;
  if (!interface.empty()) rc["network_interface_name"] = interface;
  return rc;
}

namespace {

GroupSpec parseGroupSpec(const std::string& entry, const std::string& what, bool withCount) {
  // NAME[=COUNT][:TYPE]
  GroupSpec g;
  auto colon = entry.find(':');
  if (colon != std::string::npos) g.instanceType = entry.substr(colon + 1);
  auto head = entry.substr(0, colon);
  auto eq = head.find('=');
  g.name = head.substr(0, eq);
  if (g.name.empty()) throw ConfigError(what + ": entry '" + entry + "' has no group name");
  if (withCount) {
    auto count = eq == std::string::npos ? std::string() : head.substr(eq + 1);
    bool ok = !count.empty() && count.size() <= 4 &&
              std::all_of(count.begin(), count.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!ok || std::stoul(count) == 0) {
      throw ConfigError(what + ": entry '" + entry + "' needs a size from 1 up: NAME=COUNT[:TYPE]");
    }
    g.count = std::stoul(count);
  } else if (eq != std::string::npos) {
    throw ConfigError(what + ": entry '" + entry + "' must be NAME[:TYPE]");
  }
  return g;
}

}  // namespace

std::vector<GroupSpec> parseGroupSpecs(const std::string& text, const std::string& what,
                                       bool withCount) {
  std::vector<GroupSpec> specs;
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ',')) specs.push_back(parseGroupSpec(entry, what, withCount));
  return specs;
}

}  // namespace troupe
