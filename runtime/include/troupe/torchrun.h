// File: troupe/torchrun.h
//
// torchrun's environment for an instance of a job, known from the cluster description alone,
// before anything starts: what the launchers (`troupe sim`, SageMaker's `train`, Slurm's and
// Kubernetes' `troupe-node`, through `troupe env --torchrun`) put in a script's environment so
// that a torchrun script - `init_process_group()` on its first lines - runs unchanged.
//
// The ranks are troupe.data's (actors/train/script_job.cpp): the training group is the head's
// group, its hosts sorted (the head is the first), one process each. A training instance gets
// RANK (its place), LOCAL_RANK 0, WORLD_SIZE (the group's hosts), LOCAL_WORLD_SIZE 1, GROUP_RANK,
// MASTER_ADDR (the head) and MASTER_PORT, and GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, the
// description's network interface (the collectives on the cluster's private network). Any other
// instance (the data group) is no rank, but its
// script runs to its DataLoader through the same first lines: it gets a world of one on itself
// (RANK 0, WORLD_SIZE 1, MASTER_ADDR 127.0.0.1 and a port of its own), and TROUPE_DDP_ROLE=data
// (troupe.data then forms that world with gloo, whatever backend the script names). Where an
// instance runs several processes (troupe_procs_per_host, or a GPU type's several GPUs) the
// others are started by the DataLoader, after the first lines: nothing is set before then, and
// the DataLoader sets it (docs/pytorch.md, DDP).

#pragma once

#include <string>
#include <utility>
#include <vector>

#include "troupe/config.h"

namespace troupe {

struct TorchrunEnvironment {
  std::vector<std::pair<std::string, std::string>> variables;  // in the order torchrun names them
  std::string why;  // when `variables` is empty: why none can be set before the script starts
};

struct TorchrunPorts {
  std::string masterAddr;  // how the ranks reach the head (its address; empty: its host name)
  unsigned masterPort = 29500;  // rank 0's store (torchrun's default)
  unsigned alonePort = 29500;   // a free port on `host` for a world of one (a data instance)
};

TorchrunEnvironment torchrunEnvironment(const ClusterConfig& config, const std::string& headGroup,
                                        unsigned procsPerHost, const std::string& host,
                                        const TorchrunPorts& ports);
// The variables for `host` of `config` whose head group is `headGroup` (empty: the default head,
// ClusterConfig::headHost; a group the cluster lacks falls back to it, as run() does).
// `procsPerHost`: TROUPE_PROCS_PER_HOST's value, 0 when unset (then a GPU type's GPUs).

TorchrunEnvironment torchrunAlone(unsigned port);
// An instance that is no rank (a data instance, a host that joins later): a world of one on
// itself, its store on 127.0.0.1:`port`.

}  // namespace troupe
