// File: troupe/node_size.h
//
// What a node tells the head about itself: its vCPUs, GPUs and memory, its user labels and its
// custom resources, and where each figure came from. troupe::run() and `troupe env` both use it.
//
// Sizes. The instance type's row in troupe's table (troupe/sched/instance_types.h) is a ceiling:
// a node never reports more than its type claims. Below it, the machine decides:
//
//   vcpus   the lower of the cgroup's CPU quota (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us /
//           cpu.cfs_period_us; quota / period rounded up; the lowest along the cgroup's ancestors)
//           and the CPU affinity mask (sched_getaffinity)
//   memory  the lower of the cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes) and
//           MemTotal in /proc/meminfo
//   gpus    the CUDA device count when troupe was built with CUDA, else the entries of
//           /proc/driver/nvidia/gpus; for Trainium types (ml.trn1.*) the /dev/neuron<N> devices
//
// A figure the machine lowers below the table's is used, with one log line saying so. A type not
// in the table (or none: bare metal) reports the machine's figures. --vcpus, --gpus and
// --memory-bytes (TROUPE_VCPUS, TROUPE_GPUS, TROUPE_MEMORY_BYTES) replace the machine's figure,
// also above it (`troupe sim` emulates the table's sizes on a small machine this way), but not the
// ceiling.
//
// Labels and resources. In increasing precedence, per key: the cluster file's top-level "labels"
// / "resources" (every host), its instance group's (that group's hosts), then --labels /
// TROUPE_LABELS and --resources / TROUPE_RESOURCES (this process). The scheduler matches labels
// with Placement::labels(selector) and resources with Placement::resource(name, amount).

#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

using NodeLabels = std::map<std::string, std::string>;
using NodeResources = std::map<std::string, double>;  // whole or fractional units, > 0

NodeLabels parseLabels(const std::string& text, const std::string& what);
// "zone=a,disk=nvme" -> {disk: nvme, zone: a}; "" -> {}. Keys and values are made of A-Z a-z 0-9
// . _ - / (what a label selector can name); `group`, `instance_type` and `host` are the runtime's
// own and refused. Throws ConfigError naming `what` (the flag or file), the text and the form
// expected.

NodeResources parseResources(const std::string& text, const std::string& what);
// "fpga=2,nvme=0.5" -> {fpga: 2, nvme: 0.5}; "" -> {}. Names as label keys; amounts above 0 with at
// most 3 decimals (the scheduler counts thousandths). `cpu`, `gpu` and `memory` are refused: they
// are --vcpus, --gpus and --memory-bytes. Throws ConfigError as parseLabels.

std::string formatLabels(const NodeLabels& labels);           // "disk=nvme,zone=a"
std::string formatResources(const NodeResources& resources);  // "fpga=2,nvme=0.5"

// -- what the machine has --

std::optional<unsigned> parseCpuMax(const std::string& text, const std::string& what);
// cgroup v2 cpu.max "150000 100000" -> 2 (quota / period, rounded up); "max 100000" -> none.
// Throws ConfigError naming `what` (the file) and the text when it is neither.
std::optional<unsigned> parseCfsQuota(const std::string& quota, const std::string& period,
                                      const std::string& what);
// cgroup v1 cpu.cfs_quota_us and cpu.cfs_period_us: "-1" -> none, "150000" "100000" -> 2.
std::optional<uint64_t> parseMemoryMax(const std::string& text, const std::string& what);
// cgroup v2 memory.max (or v1 memory.limit_in_bytes) in bytes; "max" -> none. v1 writes "no
// limit" as a number near 2^63, which is returned as it is (the lower figure wins anyway).
std::optional<uint64_t> parseMemTotal(const std::string& meminfo);
// /proc/meminfo's "MemTotal:  16318480 kB" in bytes; none without that line.

struct MachineFacts {
  // What probeMachine() found; a figure is absent where its source does not exist here. Each
  // `...From` says where the figure was read, for `troupe env` and the log.
  std::optional<unsigned> cgroupCpus;
  std::string cgroupCpusFrom;  // "/sys/fs/cgroup/job/cpu.max '100000 100000'"
  std::optional<unsigned> affinityCpus;
  std::string affinityFrom;  // "sched_getaffinity 0-3"
  std::optional<uint64_t> cgroupMemory;
  std::string cgroupMemoryFrom;
  std::optional<uint64_t> memTotal;
  std::string memTotalFrom;
  unsigned gpus = 0;
  std::string gpusFrom;  // "CUDA (cudaGetDeviceCount)" or "/proc/driver/nvidia/gpus (2 entries)"
  unsigned neuronDevices = 0;
  std::string neuronFrom;
};

MachineFacts probeMachine(const std::string& root = "");
// Reads this machine's limits. `root` empty: the live system (the affinity mask from
// sched_getaffinity, the CUDA count when built with CUDA). A test passes a folder shaped like one:
// proc/self/mountinfo, proc/self/cgroup, proc/self/status (Cpus_allowed_list stands in for the
// affinity mask), proc/meminfo, the cgroup files under the mount points mountinfo names,
// proc/driver/nvidia/gpus/<entries>, dev/neuron<N>. Unreadable or malformed files throw
// ConfigError naming the file.

// -- CPU throttling --

std::vector<std::string> cgroupCpuStatFiles(const std::string& root = "");
// The cpu.stat files of this process's cgroup and of each ancestor up to its mount (the v2
// hierarchy, and v1's holding "cpu"), where they exist: where a CPU quota throttles this process.
std::optional<uint64_t> parseThrottledUs(const std::string& cpuStat);
// cpu.stat's time throttled, in microseconds: v2 "throttled_usec N", v1 "throttled_time N" (ns).
// None without either line.

struct SizeFlags {
  unsigned vcpus = 0, gpus = 0;  // --vcpus, --gpus; 0: not given
  uint64_t memoryBytes = 0;      // --memory-bytes; 0: not given
};

struct Figure {
  uint64_t value = 0;
  std::string
      source;  // "table", "cgroup", "affinity", "meminfo", "CUDA", "nvidia", "neuron", "flag"
  std::string detail;  // where exactly: the file and its text, the type's row, the flag
};

struct NodeSize {
  Figure vcpus, gpus, memoryBytes;
  std::vector<std::string> notes;
  // One line per figure the machine (or a flag above the ceiling) lowered from the instance
  // type's, and for a type not in the table; run() logs each.
};

NodeSize sizeNode(const std::string& instanceType, const MachineFacts& machine,
                  const SizeFlags& flags);
// The rule at the top of this file. Always at least 1 vCPU.

struct NodeFlags {
  // This process's own settings: run()'s --vcpus, --gpus, --memory-bytes, --labels, --resources
  // (or their TROUPE_* variables), as text where they are lists.
  SizeFlags size;
  std::string labels, resources;
};

struct NodeDescription {
  NodeSize size;
  NodeLabels labels;
  NodeResources resources;
  std::map<std::string, std::string> labelSources,
      resourceSources;  // key -> "cluster file", "flag"
};

NodeDescription describeNode(const std::string& instanceType, const NodeLabels& fileLabels,
                             const NodeResources& fileResources, const NodeFlags& flags,
                             const MachineFacts& machine);
// What a node reports: sizeNode(), and the cluster file's labels and resources (its instance
// group's, ClusterConfig) with the flags' over them per key. Throws ConfigError for bad flags,
// naming --labels (TROUPE_LABELS) or --resources (TROUPE_RESOURCES).

}  // namespace troupe
