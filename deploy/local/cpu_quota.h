// `troupe sim --cpu-quota HOST_OR_GROUP=CPUS`: an instance in a cgroup of its own whose CPU quota
// is CPUS (a fraction allowed), to emulate an instance smaller than one of this machine's CPUs
// (bench_pipeline's sweeps of data-group sizes). cgroup v2 cpu.max where the v2 hierarchy has the
// cpu controller, else v1 cpu.cfs_quota_us; needs a hierarchy this process may write (root).
//
// The default CPU budget (--cpu-scale auto) is a weight alone, no quota: its budgets divide the
// whole machine, on CPUs of their own where they pack, so under contention each instance gets its
// share, and a quota would add only its stalls. A quota's period refills at its rate: kernel time
// spent past it (a long system call, page reclaim) is a debt repaid before any thread of the
// cgroup runs again. On this VM (Linux 6.18) a 0.5-CPU cgroup whose thread spent ~0.7 s in one
// system call froze for 1.3-2.5 s, a sleeping thread of it too (a test: cluster_runtime_test.cpp,
// "a node stalled by its CPU quota ...").

#pragma once

#include <string>
#include <vector>

namespace sim {

class CpuQuotaCgroup {
 public:
  // Creates the cgroup `name` (a single path component) weighted for `cpus` CPUs and, when
  // `capped`, limited to them. When that cannot be done, `why()` says why and `wrap()` must not
  // be used.
  CpuQuotaCgroup(const std::string& name, double cpus, bool capped = true);
  ~CpuQuotaCgroup();  // removes the cgroup (its processes have exited by then)
  CpuQuotaCgroup(const CpuQuotaCgroup&) = delete;
  CpuQuotaCgroup& operator=(const CpuQuotaCgroup&) = delete;

  // Removes the cgroups of simulators that are gone (a troupe sim killed by SIGKILL leaves them).
  static void removeStale();

  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }
  bool capped() const { return capped_; }

  // `argv` run inside the cgroup: a shell moves itself in, then execs `argv`, so every thread the
  // program starts is in it from the first instruction.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const;

 private:
  std::string dir_, why_;
  bool capped_ = true;
};

}  // namespace sim
