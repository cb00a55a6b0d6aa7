// `troupe env`: what a node sees - its cluster description (from a SageMaker-shaped root, also
// the hyperparameters, decoded, and the channels) and what it reports to the head (vCPUs, GPUs,
// memory, labels, resources) - through the same functions troupe::run() uses, each figure with
// where it came from.
//
//   troupe env [--root DIR] [--cluster FILE] [--vcpus N] [--gpus N] ...
//   troupe env --torchrun [--root DIR] [--cluster FILE] [--head-group G]
//
// With --torchrun it prints, one KEY=VALUE a line, the torchrun environment a script on this host
// starts with (troupe/torchrun.h): what the per-instance entry points (SageMaker's train,
// troupe-node) add to a script's environment where the job's does not set it already.

#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "troupe/node_size.h"

namespace sim {

// `troupe env`'s settings: where the description is, and the node's own flags.
struct EnvOptions {
  std::string root, cluster;
  troupe::NodeFlags node;
  bool torchrun = false;  // --torchrun: torchrun's environment for this host, KEY=VALUE lines
  std::string headGroup;  // --head-group / TROUPE_HEAD_GROUP
};

CLI::App* addEnvCommand(CLI::App& cli, EnvOptions& options);
// The `env` subcommand and its options, writing into `options`.

int runEnv(const EnvOptions& options);
// Prints the JSON; returns the exit code: 0, or CONFIG_ERROR naming what cannot be read.

}  // namespace sim
