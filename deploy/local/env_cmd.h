// `troupe env`: what a node sees - its cluster description (from a SageMaker-shaped root, also
// the hyperparameters, decoded, and the channels) and what it reports to the head (vCPUs, GPUs,
// memory, labels, resources) - through the same functions troupe::run() uses, each figure with
// where it came from.
//
//   troupe env [--root DIR] [--cluster FILE] [--vcpus N] [--gpus N] ...

#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "troupe/node_size.h"

namespace sim {

// `troupe env`'s settings: where the description is, and the node's own flags.
struct EnvOptions {
  std::string root, cluster;
  troupe::NodeFlags node;
};

CLI::App* addEnvCommand(CLI::App& cli, EnvOptions& options);
// The `env` subcommand and its options, writing into `options`.

int runEnv(const EnvOptions& options);
// Prints the JSON; returns the exit code: 0, or CONFIG_ERROR naming what cannot be read.

}  // namespace sim
