// File: troupe/config.h
//
// The cluster description: which hosts exist, which instance group each belongs to, which host this
// process is, and which host is the head. It has the shape of SageMaker's
// /opt/ml/input/config/resourceconfig.json, which is also the shape of an explicit cluster file for
// bare metal, Slurm heterogeneous jobs and Kubernetes, and of the files `troupe sim` writes:
//
//   {"current_host": "algo-1", "current_group_name": "data_group",
//    "current_instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2"],
//    "network_interface_name": "eth0",
//    "instance_groups": [{"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge",
//                         "hosts": ["algo-1"]}, ...]}
//
// A homogeneous job has no `instance_groups`: every host is then in one group named after
// `current_group_name` (SageMaker says "homogeneousCluster").

#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

class ConfigError : public std::runtime_error {
  // A bad cluster description or option. The message names the file, the key, the value and what
  // to do; the process exits with ExitCode::CONFIG_ERROR.
 public:
  using std::runtime_error::runtime_error;
};

struct InstanceGroup {
  std::string name;
  std::string instanceType;
  std::vector<std::string> hosts;  // sorted
};

struct ClusterConfig {
  std::string source;  // the file it came from, for messages
  std::string currentHost;
  std::string currentGroup;
  std::string currentInstanceType;
  std::string networkInterface;
  std::vector<std::string> hosts;     // sorted
  std::vector<InstanceGroup> groups;  // sorted by name; never empty after parse()

  static ClusterConfig parse(const std::string& json, const std::string& source);
  // Parses and checks a description: every host in exactly one group, no duplicates, the current
  // host present, groups not empty. Throws ConfigError.
  static ClusterConfig load(const std::string& path);

  const InstanceGroup* findGroup(const std::string& name) const;
  const InstanceGroup& groupOf(const std::string& host) const;
  std::string groupNames() const;  // "data_group, dnn_group", for messages

  std::string headHost(const std::string& headGroup) const;
  // The head: the first host (sorted) of `headGroup`; when that is empty, of the first group whose
  // instance type has GPUs; else the first of all hosts. Throws ConfigError for an unknown group.
};

struct HostMap {
  // Where each host listens: "algo-2" -> "127.0.0.1:41002". Without an entry a host listens on
  // `defaultPort` and is reached by its name (resolved through DNS, with retry).
  std::map<std::string, std::string> addresses;
  unsigned defaultPort = 7077;

  static HostMap load(const std::string& path);  // {"algo-1": "127.0.0.1:41001", ...}
  std::string addressOf(const std::string& host) const;
};

}  // namespace troupe
