// `troupe sim --cpu-quota HOST_OR_GROUP=CPUS`: an instance in a cgroup of its own whose CPU quota
// is CPUS (a fraction allowed), to emulate an instance smaller than one of this machine's CPUs
// (bench_pipeline's sweeps of data-group sizes). cgroup v2 cpu.max where the v2 hierarchy has the
// cpu controller, else v1 cpu.cfs_quota_us; needs a hierarchy this process may write (root).

#pragma once

#include <string>
#include <vector>

namespace sim {

class CpuQuotaCgroup {
 public:
  // Creates the cgroup `name` (a single path component) limited to `cpus` CPUs. When that cannot
  // be done, `why()` says why and `wrap()` must not be used.
  CpuQuotaCgroup(const std::string& name, double cpus);
  ~CpuQuotaCgroup();  // removes the cgroup (its processes have exited by then)
  CpuQuotaCgroup(const CpuQuotaCgroup&) = delete;
  CpuQuotaCgroup& operator=(const CpuQuotaCgroup&) = delete;

  // Removes the cgroups of simulators that are gone (a troupe sim killed by SIGKILL leaves them).
  static void removeStale();

  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

  // `argv` run inside the cgroup: a shell moves itself in, then execs `argv`, so every thread the
  // program starts is in it from the first instruction.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const;

 private:
  std::string dir_, why_;
};

}  // namespace sim
