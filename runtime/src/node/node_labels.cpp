// User labels and custom resources of a node (troupe/node_size.h): their text forms.

#include <algorithm>
#include <sstream>

#include "troupe/config.h"
#include "troupe/node_size.h"
#include "troupe/sched/resources.h"

namespace troupe {

namespace {

bool isNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/';
}

bool isName(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), isNameChar);
}

// Splits "k=v,k2=v2" into pairs; `form` is what a bad entry is told to look like.
std::vector<std::pair<std::string, std::string>> splitPairs(const std::string& text,
                                                            const std::string& what,
                                                            const std::string& form) {
  std::vector<std::pair<std::string, std::string>> pairs;
  if (text.empty()) return pairs;
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ',')) {
    auto eq = entry.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(what + " '" + text + "': entry '" + entry + "' has no '='; expected " +
                        form);
    }
    pairs.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  if (text.back() == ',') {
    throw ConfigError(what + " '" + text + "': an empty entry after the last ','; expected " +
                      form);
  }
  return pairs;
}

}  // namespace

NodeLabels parseLabels(const std::string& text, const std::string& what) {
  const std::string form = "KEY=VALUE[,KEY=VALUE...], e.g. zone=a,disk=nvme";
  const std::string chars = " (letters, digits and . _ - /)";
  NodeLabels labels;
  for (auto& [key, value] : splitPairs(text, what, form)) {
    if (!isName(key)) {
      throw ConfigError(what + " '" + text + "': '" + key + "' is not a label key" + chars +
                        "; expected " + form);
    }
    if (!isName(value)) {
      throw ConfigError(what + " '" + text + "': '" + value + "' is not a value for label '" + key +
                        "'" + chars + "; expected " + form);
    }
    if (key == "group" || key == "instance_type" || key == "host") {
      throw ConfigError(what + " '" + text + "': label '" + key +
                        "' is set by troupe itself (group, instance_type, host); choose another "
                        "key");
    }
    if (!labels.emplace(key, value).second) {
      throw ConfigError(what + " '" + text + "': label '" + key + "' is given twice; give it once");
    }
  }
  return labels;
}

NodeResources parseResources(const std::string& text, const std::string& what) {
  const std::string form = "NAME=AMOUNT[,NAME=AMOUNT...] with AMOUNT like 2 or 0.5, e.g. fpga=2";
  NodeResources resources;
  for (auto& [name, amount] : splitPairs(text, what, form)) {
    if (!isName(name)) {
      throw ConfigError(what + " '" + text + "': '" + name +
                        "' is not a resource name (letters, digits and . _ - /); expected " + form);
    }
    if (name == "cpu" || name == "gpu" || name == "memory" || name == "cpus" || name == "gpus") {
      throw ConfigError(what + " '" + text + "': '" + name +
                        "' is not a custom resource; set it with --vcpus, --gpus or "
                        "--memory-bytes");
    }
    // digits ["." 1 to 3 digits], as the placement text's amounts.
    auto dot = amount.find('.');
    auto whole = amount.substr(0, dot);
    auto frac = dot == std::string::npos ? std::string() : amount.substr(dot + 1);
    auto digits = [](const std::string& s) {
      return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    bool ok = !whole.empty() && whole.size() <= 9 && digits(whole) && digits(frac) &&
              (dot == std::string::npos || (!frac.empty() && frac.size() <= 3));
    if (!ok) {
      throw ConfigError(what + " '" + text + "': '" + amount + "' is not an amount for '" + name +
                        "'; expected " + form + " (at most 3 decimals)");
    }
    double value = std::stod(amount);
    if (sched::toMilli(value) <= 0) {
      throw ConfigError(what + " '" + text + "': resource '" + name +
                        "' must be more than 0; leave it out instead");
    }
    if (!resources.emplace(name, value).second) {
      throw ConfigError(what + " '" + text + "': resource '" + name +
                        "' is given twice; give it once");
    }
  }
  return resources;
}

std::string formatLabels(const NodeLabels& labels) {
  std::string out;
  for (auto& [k, v] : labels) out += (out.empty() ? "" : ",") + k + "=" + v;
  return out;
}

std::string formatResources(const NodeResources& resources) {
  std::string out;
  for (auto& [k, v] : resources) {
    out += (out.empty() ? "" : ",") + k + "=" + sched::formatMilli(sched::toMilli(v));
  }
  return out;
}

}  // namespace troupe
