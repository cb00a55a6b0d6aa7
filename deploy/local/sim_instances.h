// `troupe sim`'s instances (sim_run.cpp runs them): each instance's host name, address, CPU set,
// CPU budget, root and environment, laid out before a run starts its processes.

#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <kj/common.h>

#include "cpu_quota.h"
#include "netns.h"
#include "sim_run.h"
#include "troupe/process.h"

namespace sim {

struct Instance {
  std::string host, group, instanceType, address, root, cpus;
  unsigned controlPort = 0;  // on loopback: reserved with the others (TROUPE_CONTROL_PORT)
  double cpuQuota = 0;  // --cpu-quota, or the CPU budget: CPUs (0: none)
  double cpuScale = 0;  // > 0: cpuQuota is the CPU budget, this many CPUs per vCPU
  std::unique_ptr<CpuQuotaCgroup> cgroup;
  kj::Own<troupe::ChildProcess> process;
  kj::Maybe<troupe::ChildExit> exit;  // its last process's, once the host is done
  unsigned startDelayMs = 0;          // --start-late, --scale-up
  std::string hostMap;                // --scale-up: its own (the job's plus itself)
  unsigned incarnation = 0;           // processes started so far, less one
  bool wasHead = false;               // a process of it said it is the head
  std::vector<std::string> torchrun;  // torchrun's environment, KEY=VALUE (troupe/torchrun.h)
  // Every process's end, first to last: pid, the wait status's code and signal.
  struct Ended {
    int pid;
    troupe::ChildExit exit;
  };
  std::vector<Ended> ended;
  int finalCode() const;
};

int codeOf(const troupe::ChildExit& e);
// A process's exit as a shell reports it: its status, or 128 + the signal.
std::string formatCpus(double cpus);
std::vector<Instance> layOut(const JobSpec& spec, std::mt19937& rng,
                             const std::filesystem::path& dir, std::optional<NetnsLab>& lab);
// The run's instances, their roots written (sim_instances.cpp says how they are dealt).
std::vector<std::string> environment(const Instance& in, const JobSpec& spec,
                                     const std::filesystem::path& hostMap, bool netns);
// What an instance's processes are started with.
std::string cpuBudget(std::vector<Instance>& instances, const JobSpec& spec);
// Gives the instances their CPU budgets (--cpu-scale); returns why there are none, or "".

}  // namespace sim
