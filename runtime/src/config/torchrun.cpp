// torchrun's environment from the cluster description (troupe/torchrun.h).

#include "troupe/torchrun.h"

#include <algorithm>

#include "troupe/sched/instance_types.h"

namespace troupe {

TorchrunEnvironment torchrunAlone(unsigned port) {
  TorchrunEnvironment out;
  out.variables = {{"RANK", "0"},
                   {"LOCAL_RANK", "0"},
                   {"WORLD_SIZE", "1"},
                   {"LOCAL_WORLD_SIZE", "1"},
                   {"GROUP_RANK", "0"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", std::to_string(port)},
                   {"TROUPE_DDP_ROLE", "data"}};
  return out;
}

TorchrunEnvironment torchrunEnvironment(const ClusterConfig& config, const std::string& headGroup,
                                        unsigned procsPerHost, const std::string& host,
                                        const TorchrunPorts& ports) {
  TorchrunEnvironment out;
  auto group = config.missingHeadGroup(headGroup) ? std::string() : headGroup;
  auto head = config.headHost(group);
  auto& training = config.groupOf(head);
  auto& hosts = training.hosts;  // sorted: the head first
  auto mine = std::find(hosts.begin(), hosts.end(), host);
  if (mine == hosts.end()) return torchrunAlone(ports.alonePort);
  unsigned procs = procsPerHost;
  if (procs == 0) {
    auto type = sched::findInstanceType(training.instanceType);
    procs = std::max(1u, type ? type->gpus : 1u);
  }
  if (procs > 1) {
    out.why = "the training group's instances run " + std::to_string(procs) +
              " processes each, started by the DataLoader: it sets torchrun's environment";
    return out;
  }
  auto rank = std::to_string(mine - hosts.begin());
  out.variables = {{"RANK", rank},
                   {"LOCAL_RANK", "0"},
                   {"WORLD_SIZE", std::to_string(hosts.size())},
                   {"LOCAL_WORLD_SIZE", "1"},
                   {"GROUP_RANK", rank},
                   {"MASTER_ADDR", ports.masterAddr.empty() ? head : ports.masterAddr},
                   {"MASTER_PORT", std::to_string(ports.masterPort)},
                   {"TROUPE_DDP_ROLE", "rank"}};
  // The collectives on the cluster's private network (docs/security.md, "DDP"), as the
  // DataLoader sets them for a script that makes it first.
  if (!config.networkInterface.empty()) {
    out.variables.push_back({"GLOO_SOCKET_IFNAME", config.networkInterface});
    out.variables.push_back({"NCCL_SOCKET_IFNAME", config.networkInterface});
  }
  return out;
}

}  // namespace troupe
