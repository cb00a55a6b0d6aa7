#include "troupe/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string.h>

#include "troupe/sched/instance_types.h"

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

// "labels" or "resources" of `j` (the top level or a group) over `labels`/`resources`, per key.
void addLabelsAndResources(const json& j, const std::string& where, const std::string& source,
                           NodeLabels& labels, NodeResources& resources) {
  auto what = [&](const char* key) { return "cluster file " + source + ": '" + key + "'" + where; };
  if (auto it = j.find("labels"); it != j.end()) {
    if (!it->is_object()) {
      throw ConfigError(what("labels") +
                        " must be an object of strings, e.g. {\"zone\": \"a\"}, "
                        "not " +
                        it->dump());
    }
    std::string text;
    for (auto& [key, value] : it->items()) {
      if (!value.is_string()) {
        throw ConfigError(what("labels") + ": the value of '" + key + "' must be a string, not " +
                          value.dump());
      }
      text += (text.empty() ? "" : ",") + key + "=" + value.get<std::string>();
    }
    for (auto& [k, v] : parseLabels(text, what("labels"))) labels[k] = v;
  }
  if (auto it = j.find("resources"); it != j.end()) {
    if (!it->is_object()) {
      throw ConfigError(what("resources") +
                        " must be an object of amounts, e.g. {\"fpga\": 2}, "
                        "not " +
                        it->dump());
    }
    std::string text;
    for (auto& [key, value] : it->items()) {
      if (!value.is_number()) {
        throw ConfigError(what("resources") + ": the amount of '" + key +
                          "' must be a number, not " + value.dump());
      }
      text += (text.empty() ? "" : ",") + key + "=" + value.dump();
    }
    for (auto& [k, v] : parseResources(text, what("resources"))) resources[k] = v;
  }
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
  NodeLabels everyLabel;
  NodeResources everyResource;
  addLabelsAndResources(j, "", source, everyLabel, everyResource);

  auto groups = j.find("instance_groups");
  if (groups == j.end() || (groups->is_array() && groups->empty())) {
    // Homogeneous: one group holding every host.
    InstanceGroup g;
    g.name = c.currentGroup.empty() ? "homogeneousCluster" : c.currentGroup;
    g.instanceType = c.currentInstanceType;
    g.hosts = c.hosts;
    g.labels = everyLabel;
    g.resources = everyResource;
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
      g.labels = everyLabel;
      g.resources = everyResource;
      addLabelsAndResources(gj, " of instance group '" + g.name + "'", source, g.labels,
                            g.resources);
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

std::string randomToken() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 32; ++i) t += "0123456789abcdef"[rd() % 16];
  return t;
}

}  // namespace troupe
