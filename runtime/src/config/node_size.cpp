// A node's size (troupe/node_size.h): what the machine allows, and the rule that combines it with
// the instance type's row and the flags.

#include "troupe/node_size.h"

#include <sched.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/config.h"
#include "troupe/sched/instance_types.h"
#include "troupe/sched/resources.h"

#ifdef TROUPE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace troupe {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> readIfExists(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  if (!in) throw ConfigError(path + " cannot be read: " + strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\n"));
  s.erase(s.find_last_not_of(" \t\n") + 1);
  return s;
}

bool allDigits(const std::string& s) {
  return !s.empty() && s.size() <= 19 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

unsigned quotaCpus(uint64_t quota, uint64_t period) {
  return static_cast<unsigned>(std::max<uint64_t>(1, (quota + period - 1) / period));
}

bool hasToken(const std::string& list, const std::string& token) {
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    if (t == token) return true;
  }
  return false;
}

// A cgroup hierarchy this process is in: the folder of its cgroup and the mount point above it.
struct CgroupDir {
  std::string leaf, mount;
};

// The folders of this process's cgroups: the v2 one, and the v1 one holding `controller`.
std::vector<CgroupDir> cgroupDirs(const std::string& root, const std::string& controller) {
  auto mountinfo = readIfExists(root + "/proc/self/mountinfo");
  auto membership = readIfExists(root + "/proc/self/cgroup");
  if (!mountinfo || !membership) return {};
  // Where this process is in each hierarchy: "" for v2 ("0::/x"), the controllers for v1.
  std::map<std::string, std::string> pathOf;
  std::stringstream ms(*membership);
  std::string line;
  while (std::getline(ms, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    pathOf[line.substr(a + 1, b - a - 1)] = line.substr(b + 1);
  }
  std::vector<CgroupDir> dirs;
  std::stringstream is(*mountinfo);
  while (std::getline(is, line)) {
    // "36 25 0:32 / /sys/fs/cgroup/cpu rw,relatime shared:1 - cgroup cgroup rw,cpu,cpuacct"
    std::stringstream ls(line);
    std::string id, parent, dev, mroot, point, word, type, source, superOpts;
    ls >> id >> parent >> dev >> mroot >> point;
    while (ls >> word && word != "-") {
    }
    ls >> type >> source >> superOpts;
    std::optional<std::string> path;
    if (type == "cgroup2") {
      if (pathOf.count("")) path = pathOf[""];
    } else if (type == "cgroup" && hasToken(superOpts, controller)) {
      for (auto& [controllers, p] : pathOf) {
        if (hasToken(controllers, controller)) path = p;
      }
    }
    if (!path) continue;
    // A mount of a subtree (a container's cgroup namespace) starts at its root.
    if (mroot != "/" && path->rfind(mroot, 0) == 0) path = path->substr(mroot.size());
    if (*path == "/") path = "";
    dirs.push_back({root + point + *path, root + point});
  }
  return dirs;
}

// Calls `read(folder)` for the cgroup's folder and each ancestor up to the mount; the lowest wins.
template <typename T, typename Read>
void lowestUpwards(const CgroupDir& dir, Read read, std::optional<T>& best, std::string& from) {
  fs::path p = dir.leaf;
  fs::path mount = dir.mount;
  while (true) {
    std::string where;
    if (auto value = read(p.string(), where)) {
      if (!best || *value < *best) {
        best = value;
        from = where;
      }
    }
    if (p == mount || p == p.parent_path() || p.string().size() <= mount.string().size()) break;
    p = p.parent_path();
  }
}

void probeCpus(const std::string& root, MachineFacts& m) {
  for (auto& dir : cgroupDirs(root, "cpu")) {
    lowestUpwards<unsigned>(
        dir,
        [](const std::string& folder, std::string& where) -> std::optional<unsigned> {
          if (auto text = readIfExists(folder + "/cpu.max")) {
            where = folder + "/cpu.max '" + trim(*text) + "'";
            return parseCpuMax(*text, folder + "/cpu.max");
          }
          auto quota = readIfExists(folder + "/cpu.cfs_quota_us");
          auto period = readIfExists(folder + "/cpu.cfs_period_us");
          if (!quota || !period) return std::nullopt;
          where = folder + "/cpu.cfs_quota_us '" + trim(*quota) + "' / cpu.cfs_period_us '" +
                  trim(*period) + "'";
          return parseCfsQuota(*quota, *period, folder + "/cpu.cfs_quota_us");
        },
        m.cgroupCpus, m.cgroupCpusFrom);
  }
  if (root.empty()) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      std::vector<unsigned> cpus;
      for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
      }
      m.affinityCpus = cpus.size();
      m.affinityFrom = "sched_getaffinity " + formatCpuList(cpus);
    }
  } else if (auto status = readIfExists(root + "/proc/self/status")) {
    std::stringstream ss(*status);
    std::string line;
    const std::string key = "Cpus_allowed_list:";
    while (std::getline(ss, line)) {
      if (line.rfind(key, 0) != 0) continue;
      auto list = trim(line.substr(key.size()));
      m.affinityCpus = parseCpuList(list, root + "/proc/self/status Cpus_allowed_list").size();
      m.affinityFrom = "Cpus_allowed_list " + list;
    }
  }
}

void probeMemory(const std::string& root, MachineFacts& m) {
  for (auto& dir : cgroupDirs(root, "memory")) {
    lowestUpwards<uint64_t>(
        dir,
        [](const std::string& folder, std::string& where) -> std::optional<uint64_t> {
          for (auto* name : {"/memory.max", "/memory.limit_in_bytes"}) {
            if (auto text = readIfExists(folder + name)) {
              where = folder + name + " '" + trim(*text) + "'";
              return parseMemoryMax(*text, folder + name);
            }
          }
          return std::nullopt;
        },
        m.cgroupMemory, m.cgroupMemoryFrom);
  }
  if (auto meminfo = readIfExists(root + "/proc/meminfo")) {
    m.memTotal = parseMemTotal(*meminfo);
    if (m.memTotal) m.memTotalFrom = root + "/proc/meminfo MemTotal";
  }
}

void probeAccelerators(const std::string& root, MachineFacts& m) {
  bool counted = false;
#ifdef TROUPE_WITH_CUDA
  if (root.empty()) {
    int count = 0;
    auto status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess) {
      m.gpus = count;
      m.gpusFrom = "CUDA (cudaGetDeviceCount)";
      counted = true;
    } else {
      m.gpusFrom = std::string("CUDA: ") + cudaGetErrorString(status) + "; ";
    }
  }
#endif
  if (!counted) {
    auto dir = root + "/proc/driver/nvidia/gpus";
    std::error_code ec;
    if (fs::is_directory(dir, ec)) {
      m.gpus = std::distance(fs::directory_iterator(dir, ec), fs::directory_iterator());
      m.gpusFrom += dir + " (" + std::to_string(m.gpus) + " entries)";
    } else {
      m.gpus = 0;
      m.gpusFrom += dir + " (absent: no NVIDIA driver)";
    }
  }
  std::error_code ec;
  auto dev = root.empty() ? std::string("/dev") : root + "/dev";
  if (fs::is_directory(dev, ec)) {
    for (auto& e : fs::directory_iterator(dev, ec)) {
      auto name = e.path().filename().string();
      if (name.rfind("neuron", 0) == 0 && allDigits(name.substr(6))) ++m.neuronDevices;
    }
  }
  m.neuronFrom = dev + "/neuron<N> (" + std::to_string(m.neuronDevices) + ")";
}

// The table's figure as a ceiling over the machine's (or the flag's).
Figure capped(const char* what, const std::optional<uint64_t>& table, const std::string& typeName,
              Figure own, std::vector<std::string>& notes, std::string (*show)(uint64_t)) {
  if (!table) return own;
  Figure fromTable{*table, "table", "instance type " + typeName};
  if (own.value > *table) {
    if (own.source == "flag") {
      notes.push_back(std::string(what) + ": " + own.detail + " asks for " + show(own.value) +
                      " but instance type " + typeName + " has " + show(*table) + "; reporting " +
                      show(*table));
    }
    return fromTable;
  }
  if (own.value == *table) return own.source == "flag" ? own : fromTable;
  if (own.source != "flag") {
    notes.push_back(std::string(what) + ": instance type " + typeName + " claims " + show(*table) +
                    " but this machine allows " + show(own.value) + " (" + own.detail +
                    "); reporting " + show(own.value));
  }
  return own;
}

std::string showCount(uint64_t n) {
  return std::to_string(n);
}
std::string showBytes(uint64_t n) {
  return sched::formatBytes(n);
}

}  // namespace

std::optional<unsigned> parseCpuMax(const std::string& text, const std::string& what) {
  std::stringstream ss(trim(text));
  std::string quota, period, extra;
  ss >> quota >> period >> extra;
  auto bad = [&]() {
    return ConfigError(what + " '" + trim(text) +
                       "' is not a cgroup v2 cpu.max: expected \"QUOTA PERIOD\" or \"max PERIOD\" "
                       "(microseconds)");
  };
  if (!extra.empty() || !allDigits(period) || std::stoull(period) == 0) throw bad();
  if (quota == "max") return std::nullopt;
  if (!allDigits(quota)) throw bad();
  return quotaCpus(std::stoull(quota), std::stoull(period));
}

std::optional<unsigned> parseCfsQuota(const std::string& quota, const std::string& period,
                                      const std::string& what) {
  auto q = trim(quota), p = trim(period);
  if (q == "-1") return std::nullopt;
  if (!allDigits(q) || !allDigits(p) || std::stoull(p) == 0) {
    throw ConfigError(what + " '" + q + "' / '" + p +
                      "' is not a cgroup v1 CPU quota: expected -1 or microseconds, and a period "
                      "above 0");
  }
  return quotaCpus(std::stoull(q), std::stoull(p));
}

std::optional<uint64_t> parseMemoryMax(const std::string& text, const std::string& what) {
  auto t = trim(text);
  if (t == "max") return std::nullopt;
  if (!allDigits(t)) {
    throw ConfigError(what + " '" + t + "' is not a memory limit: expected bytes or \"max\"");
  }
  return std::stoull(t);
}

std::optional<uint64_t> parseMemTotal(const std::string& meminfo) {
  std::stringstream ss(meminfo);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::stringstream ls(line.substr(9));
    uint64_t kib = 0;
    std::string unit;
    if (ls >> kib >> unit && unit == "kB") return kib * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

std::vector<std::string> cgroupCpuStatFiles(const std::string& root) {
  std::vector<std::string> files;
  for (auto& dir : cgroupDirs(root, "cpu")) {
    std::optional<int> none;
    std::string from;
    lowestUpwards<int>(
        dir,
        [&](const std::string& folder, std::string&) -> std::optional<int> {
          if (fs::exists(folder + "/cpu.stat")) files.push_back(folder + "/cpu.stat");
          return std::nullopt;
        },
        none, from);
  }
  return files;
}

std::optional<uint64_t> parseThrottledUs(const std::string& cpuStat) {
  std::stringstream ss(cpuStat);
  std::string key;
  uint64_t value = 0;
  while (ss >> key >> value) {
    if (key == "throttled_usec") return value;
    if (key == "throttled_time") return value / 1000;
  }
  return std::nullopt;
}

MachineFacts probeMachine(const std::string& root) {
  MachineFacts m;
  probeCpus(root, m);
  probeMemory(root, m);
  probeAccelerators(root, m);
  return m;
}

NodeSize sizeNode(const std::string& instanceType, const MachineFacts& machine,
                  const SizeFlags& flags) {
  NodeSize size;
  auto type = sched::findInstanceType(instanceType);

  Figure cpus{1, "affinity", "no affinity mask (1 vCPU)"};
  if (machine.affinityCpus) cpus = {*machine.affinityCpus, "affinity", machine.affinityFrom};
  if (machine.cgroupCpus &&
      (!machine.affinityCpus || *machine.cgroupCpus <= *machine.affinityCpus)) {
    cpus = {*machine.cgroupCpus, "cgroup", machine.cgroupCpusFrom};
  }
  if (flags.vcpus) cpus = {flags.vcpus, "flag", "--vcpus (TROUPE_VCPUS)"};

  Figure mem{0, "meminfo", "no MemTotal in /proc/meminfo"};
  if (machine.memTotal) mem = {*machine.memTotal, "meminfo", machine.memTotalFrom};
  if (machine.cgroupMemory && (!machine.memTotal || *machine.cgroupMemory <= *machine.memTotal)) {
    mem = {*machine.cgroupMemory, "cgroup", machine.cgroupMemoryFrom};
  }
  if (flags.memoryBytes) mem = {flags.memoryBytes, "flag", "--memory-bytes (TROUPE_MEMORY_BYTES)"};

  bool neuron = instanceType.rfind("ml.trn", 0) == 0;
  Figure gpus =
      neuron ? Figure{machine.neuronDevices, "neuron", machine.neuronFrom}
             : Figure{machine.gpus, machine.gpusFrom.rfind("CUDA (", 0) == 0 ? "CUDA" : "nvidia",
                      machine.gpusFrom};
  if (flags.gpus) gpus = {flags.gpus, "flag", "--gpus (TROUPE_GPUS)"};

  std::optional<uint64_t> tableCpus, tableGpus, tableMem;
  if (type) {
    tableCpus = type->vcpus;
    tableGpus = type->gpus;
    tableMem = static_cast<uint64_t>(type->memoryGib * (1ull << 30));
  }
  size.vcpus = capped("vcpus", tableCpus, instanceType, cpus, size.notes, showCount);
  size.gpus = capped("gpus", tableGpus, instanceType, gpus, size.notes, showCount);
  size.memoryBytes = capped("memory", tableMem, instanceType, mem, size.notes, showBytes);
  if (size.vcpus.value == 0) size.vcpus.value = 1;
  if (!type && !instanceType.empty()) {
    size.notes.push_back("instance type '" + instanceType +
                         "' is not in troupe's table; using this machine's size (" +
                         std::to_string(size.vcpus.value) + " vcpus)");
  }
  return size;
}

NodeDescription describeNode(const std::string& instanceType, const NodeLabels& fileLabels,
                             const NodeResources& fileResources, const NodeFlags& flags,
                             const MachineFacts& machine) {
  NodeDescription d;
  d.size = sizeNode(instanceType, machine, flags.size);
  for (auto& [k, v] : fileLabels) {
    d.labels[k] = v;
    d.labelSources[k] = "cluster file";
  }
  for (auto& [k, v] : parseLabels(flags.labels, "--labels (TROUPE_LABELS)")) {
    d.labels[k] = v;
    d.labelSources[k] = "flag";
  }
  for (auto& [k, v] : fileResources) {
    d.resources[k] = v;
    d.resourceSources[k] = "cluster file";
  }
  for (auto& [k, v] : parseResources(flags.resources, "--resources (TROUPE_RESOURCES)")) {
    d.resources[k] = v;
    d.resourceSources[k] = "flag";
  }
  return d;
}

}  // namespace troupe
