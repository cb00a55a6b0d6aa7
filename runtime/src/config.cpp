#include "troupe/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <random>
#include <sstream>
#include <string.h>

#include "troupe/sched/instance_types.h"

extern char** environ;

namespace troupe {

namespace {

using nlohmann::json;

std::string readFile(const std::string& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(std::string(what) + " '" + path +
                      "' cannot be read: it is a directory; pass a file");
  }
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(std::string(what) + " '" + path + "' cannot be read: " + strerror(errno) +
                      "; pass an existing file");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    throw ConfigError(std::string(what) + " '" + path + "' cannot be read: " + strerror(errno));
  }
  return ss.str();
}

std::string getString(const json& j, const char* key, const std::string& source, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (!required) return "";
    throw ConfigError("cluster file " + source + ": key '" + key + "' is missing");
  }
  if (!it->is_string()) {
    throw ConfigError("cluster file " + source + ": key '" + key + "' must be a string, not " +
                      it->dump());
  }
  return it->get<std::string>();
}

std::vector<std::string> getHosts(const json& j, const std::string& key,
                                  const std::string& source) {
  auto it = j.find(key);
  if (it == j.end()) throw ConfigError("cluster file " + source + ": key '" + key + "' is missing");
  if (!it->is_array()) {
    throw ConfigError("cluster file " + source + ": key '" + key +
                      "' must be a list of host names, not " + it->dump());
  }
  std::vector<std::string> hosts;
  for (auto& h : *it) {
    if (!h.is_string() || h.get<std::string>().empty()) {
      throw ConfigError("cluster file " + source + ": '" + key +
                        "' must hold non-empty host names, found " + h.dump());
    }
    hosts.push_back(h.get<std::string>());
  }
  std::sort(hosts.begin(), hosts.end());
  for (size_t i = 1; i < hosts.size(); ++i) {
    if (hosts[i] == hosts[i - 1]) {
      throw ConfigError("cluster file " + source + ": host '" + hosts[i] + "' appears twice in '" +
                        key + "'; list each host once");
    }
  }
  return hosts;
}

}  // namespace

ClusterConfig ClusterConfig::parse(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError("cluster file " + source + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError("cluster file " + source + " must hold a JSON object");

  ClusterConfig c;
  c.source = source;
  c.currentHost = getString(j, "current_host", source, true);
  c.currentGroup = getString(j, "current_group_name", source, false);
  c.currentInstanceType = getString(j, "current_instance_type", source, false);
  c.networkInterface = getString(j, "network_interface_name", source, false);
  c.hosts = getHosts(j, "hosts", source);
  if (c.hosts.empty()) throw ConfigError("cluster file " + source + ": 'hosts' is empty");

  auto groups = j.find("instance_groups");
  if (groups == j.end() || (groups->is_array() && groups->empty())) {
    // Homogeneous: one group holding every host.
    InstanceGroup g;
    g.name = c.currentGroup.empty() ? "homogeneousCluster" : c.currentGroup;
    g.instanceType = c.currentInstanceType;
    g.hosts = c.hosts;
    c.groups.push_back(g);
  } else {
    if (!groups->is_array()) {
      throw ConfigError("cluster file " + source + ": 'instance_groups' must be a list, not " +
                        groups->dump());
    }
    std::map<std::string, std::string> groupOfHost;
    for (auto& gj : *groups) {
      if (!gj.is_object()) {
        throw ConfigError("cluster file " + source +
                          ": each entry of 'instance_groups' must be an object, found " +
                          gj.dump());
      }
      InstanceGroup g;
      g.name = getString(gj, "instance_group_name", source, true);
      g.instanceType = getString(gj, "instance_type", source, false);
      g.hosts = getHosts(gj, "hosts", source);
      if (g.hosts.empty()) {
        throw ConfigError("cluster file " + source + ": instance group '" + g.name +
                          "' has no hosts; give it at least one or remove it");
      }
      for (auto& h : g.hosts) {
        auto [it, fresh] = groupOfHost.emplace(h, g.name);
        if (!fresh) {
          throw ConfigError("cluster file " + source + ": host '" + h + "' is in two groups, '" +
                            it->second + "' and '" + g.name + "'; a host belongs to one group");
        }
        if (!std::binary_search(c.hosts.begin(), c.hosts.end(), h)) {
          throw ConfigError("cluster file " + source + ": host '" + h + "' of group '" + g.name +
                            "' is not in 'hosts'");
        }
      }
      if (c.findGroup(g.name) != nullptr) {
        throw ConfigError("cluster file " + source + ": instance group '" + g.name +
                          "' is listed twice");
      }
      c.groups.push_back(g);
    }
    for (auto& h : c.hosts) {
      if (groupOfHost.count(h) == 0) {
        throw ConfigError("cluster file " + source + ": host '" + h +
                          "' is in no instance group; add it to one of: " + c.groupNames());
      }
    }
  }
  std::sort(c.groups.begin(), c.groups.end(), [](auto& a, auto& b) { return a.name < b.name; });

  if (!std::binary_search(c.hosts.begin(), c.hosts.end(), c.currentHost)) {
    throw ConfigError("cluster file " + source + ": current_host '" + c.currentHost +
                      "' is not in 'hosts' (" + std::to_string(c.hosts.size()) + " hosts)");
  }
  auto& mine = c.groupOf(c.currentHost);
  if (c.currentGroup.empty()) c.currentGroup = mine.name;
  if (c.currentGroup != mine.name) {
    throw ConfigError("cluster file " + source + ": current_group_name '" + c.currentGroup +
                      "' does not match the group of current_host '" + c.currentHost + "' ('" +
                      mine.name + "')");
  }
  if (c.currentInstanceType.empty()) c.currentInstanceType = mine.instanceType;
  return c;
}

ClusterConfig ClusterConfig::load(const std::string& path) {
  return parse(readFile(path, "cluster file"), path);
}

const InstanceGroup* ClusterConfig::findGroup(const std::string& name) const {
  for (auto& g : groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

const InstanceGroup& ClusterConfig::groupOf(const std::string& host) const {
  for (auto& g : groups) {
    if (std::binary_search(g.hosts.begin(), g.hosts.end(), host)) return g;
  }
  throw ConfigError("cluster file " + source + ": host '" + host + "' is in no instance group");
}

std::string ClusterConfig::groupNames() const {
  std::string out;
  for (auto& g : groups) {
    if (!out.empty()) out += ", ";
    out += g.name;
  }
  return out;
}

std::string ClusterConfig::headHost(const std::string& headGroup) const {
  if (!headGroup.empty()) {
    auto* g = findGroup(headGroup);
    if (g == nullptr) {
      throw ConfigError("head group '" + headGroup + "' is unknown; groups are: " + groupNames());
    }
    return g->hosts.front();
  }
  for (auto& g : groups) {
    auto type = sched::findInstanceType(g.instanceType);
    if (type && type->gpus > 0) return g.hosts.front();
  }
  return hosts.front();
}

std::optional<std::string> ClusterConfig::missingHeadGroup(const std::string& headGroup) const {
  if (headGroup.empty() || findGroup(headGroup) != nullptr) return std::nullopt;
  auto head = headHost("");
  auto& group = groupOf(head);
  auto type = sched::findInstanceType(group.instanceType);
  bool gpus = type && type->gpus > 0;
  return "head group '" + headGroup + "' is not in this cluster (groups: " + groupNames() +
         "); the head is " + head + " instead, the first host of " +
         (gpus ? "group '" + group.name + "', whose " + group.instanceType + " has GPUs"
               : std::string("the cluster (no group has GPUs)"));
}

HostMap HostMap::load(const std::string& path) {
  auto text = readFile(path, "host map");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError("host map " + path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    throw ConfigError("host map " + path + " must be an object of host -> \"ip:port\"");
  }
  HostMap m;
  for (auto& [host, addr] : j.items()) {
    if (!addr.is_string()) {
      throw ConfigError("host map " + path + ": the address of '" + host +
                        "' must be a string \"ip:port\", not " + addr.dump());
    }
    m.addresses[host] = addr.get<std::string>();
  }
  return m;
}

std::string HostMap::addressOf(const std::string& host) const {
  auto it = addresses.find(host);
  if (it != addresses.end()) return it->second;
  return host + ":" + std::to_string(defaultPort);
}

// =======================================================================================
// Cluster descriptions from the environment: Slurm and Kubernetes

Environment processEnvironment() {
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq != nullptr) env.emplace(std::string(*e, eq - *e), eq + 1);
  }
  return env;
}

namespace {

const std::string* findVar(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

std::vector<std::string> splitTopLevel(const std::string& text, const std::string& what) {
  // Splits at commas outside brackets.
  std::vector<std::string> parts;
  std::string part;
  int depth = 0;
  for (char ch : text) {
    if (ch == '[') ++depth;
    if (ch == ']' && --depth < 0) break;
    if (ch == ',' && depth == 0) {
      parts.push_back(part);
      part.clear();
    } else {
      part += ch;
    }
  }
  if (depth != 0) {
    throw ConfigError(what + " '" + text + "' is not a Slurm host list: unbalanced brackets");
  }
  parts.push_back(part);
  return parts;
}

void expandOne(const std::string& expr, const std::string& list, const std::string& what,
               std::vector<std::string>& out) {
  auto bad = [&](const std::string& why) {
    return ConfigError(what + " '" + list + "' is not a Slurm host list: " + why);
  };
  auto open = expr.find('[');
  if (open == std::string::npos) {
    if (expr.empty()) throw bad("an empty host name");
    out.push_back(expr);
    return;
  }
  auto close = expr.find(']', open);
  auto prefix = expr.substr(0, open);
  auto rest = expr.substr(close + 1);
  std::string ranges = expr.substr(open + 1, close - open - 1);
  std::stringstream ss(ranges);
  std::string range;
  bool any = false;
  while (std::getline(ss, range, ',')) {
    any = true;
    auto dash = range.find('-');
    auto lo = range.substr(0, dash);
    auto hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(lo) || !digits(hi)) throw bad("'" + range + "' is not a number or range");
    unsigned from = std::stoul(lo), to = std::stoul(hi);
    if (to < from) throw bad("range '" + range + "' runs backwards");
    if (to - from > 100000) throw bad("range '" + range + "' is too large");
    for (unsigned i = from; i <= to; ++i) {
      auto n = std::to_string(i);
      if (n.size() < lo.size()) n = std::string(lo.size() - n.size(), '0') + n;
      expandOne(prefix + n + rest, list, what, out);
    }
  }
  if (!any) throw bad("empty brackets");
}

struct GroupSpec {
  std::string name, instanceType;
  unsigned count = 0;
};

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

std::vector<GroupSpec> parseGroupSpecs(const std::string& text, const std::string& what,
                                       bool withCount) {
  std::vector<GroupSpec> specs;
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ',')) specs.push_back(parseGroupSpec(entry, what, withCount));
  return specs;
}

}  // namespace

std::vector<std::string> expandHostList(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  for (auto& part : splitTopLevel(list, what)) expandOne(part, list, what, hosts);
  return hosts;
}

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

std::optional<std::string> interfaceAddress(const std::string& name) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (auto* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || name != a->ifa_name) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<struct sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

std::vector<unsigned> parseCpuList(const std::string& text, const std::string& what) {
  std::vector<unsigned> cpus;
  std::stringstream ss(text);
  std::string part;
  auto bad = [&]() {
    return ConfigError(what + " '" + text + "' is not a CPU list like \"0-3,7\"");
  };
  while (std::getline(ss, part, ',')) {
    auto dash = part.find('-');
    auto lo = part.substr(0, dash);
    auto hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 4 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(lo) || !digits(hi) || std::stoul(hi) < std::stoul(lo)) throw bad();
    for (unsigned c = std::stoul(lo); c <= std::stoul(hi); ++c) cpus.push_back(c);
  }
  if (cpus.empty()) throw bad();
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string formatCpuList(const std::vector<unsigned>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string randomToken() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 32; ++i) t += "0123456789abcdef"[rd() % 16];
  return t;
}

}  // namespace troupe
