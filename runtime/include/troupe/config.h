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
//
// troupe's own optional keys (SageMaker never writes them): "labels" ({"zone": "a"}) and
// "resources" ({"fpga": 2}) at the top level apply to every host; inside an instance group, to
// that group's hosts, over the top level's per key. --labels and --resources (troupe/run.h) go over
// both (troupe/node_size.h).
//
// Where run() finds it, first match wins: --cluster / TROUPE_CLUSTER_FILE; SageMaker's
// $TROUPE_SM_ROOT/input/config/resourceconfig.json (root /opt/ml by default; with
// TROUPE_SM_ROOT set the file must exist); a Slurm job's environment (clusterFromSlurm); a
// Kubernetes pod's (clusterFromK8s); else a one-node cluster on this machine.

#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/node_size.h"

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
  NodeLabels labels;               // the file's top-level labels, then the group's
  NodeResources resources;         // the same for custom resources
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
  std::optional<std::string> missingHeadGroup(const std::string& headGroup) const;
  // When `headGroup` is not empty and this cluster has no such group (an app's `dnn_group` on a
  // homogeneous SageMaker cluster, whose one group is "homogeneousCluster"): a one-line warning
  // naming it, the groups there are and the default head, headHost(""), used instead. run() logs
  // it and falls back; none when the group exists or none was asked for.
};

struct HostMap {
  // Where each host listens: "algo-2" -> "127.0.0.1:41002". Without an entry a host listens on
  // `defaultPort` and is reached by its name (resolved through DNS, with retry).
  std::map<std::string, std::string> addresses;
  unsigned defaultPort = 7077;

  static HostMap load(const std::string& path);  // {"algo-1": "127.0.0.1:41001", ...}
  std::string addressOf(const std::string& host) const;
};

// -- cluster descriptions from the environment --

using Environment = std::map<std::string, std::string>;
Environment processEnvironment();
// This process's environment variables.

std::vector<std::string> expandHostList(const std::string& list, const std::string& what);
// Slurm's hostlist syntax: "node[01-03,07],gpu1" -> node01 node02 node03 node07 gpu1 (zero
// padding kept; several bracket groups multiply: "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Throws
// ConfigError naming `what` (the variable) and the text when it does not parse.

std::optional<std::string> clusterFromSlurm(const Environment& env);
// A description in resourceconfig.json's shape for a Slurm job, or none when `env` is not a
// Slurm task's (no SLURMD_NODENAME, or no node list). A heterogeneous job (`#SBATCH hetjob`,
// SLURM_HET_SIZE=N) gives one instance group per component from
// SLURM_JOB_NODELIST_HET_GROUP_<n>; a plain job one group from SLURM_JOB_NODELIST. Group names
// (and optionally instance types) come from
// TROUPE_SLURM_GROUPS="data_group,dnn_group:ml.p3.2xlarge", one entry per component; without it
// they are het_group_0, het_group_1... (a plain job: "slurm"). The current host is SLURMD_NODENAME.
// Throws ConfigError naming the variable and its value.

std::optional<std::string> clusterFromK8s(const Environment& env);
// A description for a pod of a troupe job on Kubernetes (deploy/k8s), or none without
// TROUPE_K8S_GROUPS. TROUPE_K8S_GROUPS="data_group=2,dnn_group=1:ml.p3.2xlarge" names each group,
// its size and optionally its instance type. The pods of group G are G with '_' made '-' plus
// "-<index>" (a StatefulSet's or an Indexed Job's hostnames: data-group-0, data-group-1, ...),
// reached as "<pod>.<service>" through the headless service TROUPE_K8S_SERVICE (default
// "troupe"). This pod is TROUPE_POD_NAME, else HOSTNAME; it listens on eth0.

std::optional<std::string> interfaceAddress(const std::string& name);
// The first IPv4 address of network interface `name` ("eth0" -> "10.0.12.7"), or none when the
// interface does not exist or has no IPv4 address.

std::vector<unsigned> parseCpuList(const std::string& text, const std::string& what);
// "0-3,7" -> {0,1,2,3,7}. Throws ConfigError naming `what` and the text when it is not a list.
std::string formatCpuList(const std::vector<unsigned>& cpus);
// {0,1,2,3,7} -> "0-3,7".

std::string randomToken();
// A fresh cluster token: 32 hex digits from std::random_device.

}  // namespace troupe
