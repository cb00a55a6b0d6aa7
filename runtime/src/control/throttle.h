// What kept a thread from running: read when asked, so that a control thread that stalled can say
// why. Three causes, each from the kernel's own counters:
//   run queue  the thread was runnable and waited for a CPU (/proc/self/task/TID/schedstat's
//              run_delay): other work on its CPUs (a loaded machine, CPUs pinned elsewhere);
//   steal      the hypervisor ran other guests on this VM's CPUs (/proc/stat's steal, over the
//              CPUs this process may use);
//   quota      its cgroup's CPU quota throttled it (cpu.stat of its cgroup and each ancestor,
//              troupe/node_size.h's cgroupCpuStatFiles): a Kubernetes CPU limit, a `troupe sim
//              --cpu-quota`. A quota's period refills at its rate, and time a thread spent past
//              it in the kernel is a debt repaid before any thread of the cgroup runs again, so
//              one long system call can freeze a whole process for seconds.
// None of the three (a stall with no wait for a CPU): the thread was not runnable - the process
// was stopped (SIGSTOP, a debugger) or blocked in the kernel (a page fault, a full disk).

#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

class ThrottleWatch {
 public:
  ThrottleWatch();  // finds the files; none where no cgroup has the cpu controller

  struct Held {
    int64_t ms = 0;        // quota: the most any one of the cgroups was throttled
    std::string file;      // that cgroup's cpu.stat
    int64_t runQueueMs = -1;  // the watched thread's wait for a CPU; -1: not known
    int64_t stealMs = 0;   // the hypervisor's, summed over this process's CPUs
    // Read from another thread: the watched thread's state now ('R', 'S', 'D', 'T'...; 0 when read
    // on it). Its run_delay counts a wait only once it runs, so a wait not over yet is its 'R'.
    char stateNow = 0;
  };
  Held since() const;  // since the last mark()
  void mark();         // the thread that calls it first is the one watched

 private:
  std::vector<std::string> files_;
  std::vector<uint64_t> marks_;
  std::vector<unsigned> cpus_;  // this process's, for steal
  pid_t tid_ = 0;
  uint64_t runDelayMark_ = 0, stealMark_ = 0;
};

std::string throttleNote(const ThrottleWatch::Held& held, int64_t stallMs);
// What held back a thread that stalled `stallMs`: "; meanwhile it was runnable but not running for
// 1795 ms (schedstat run_delay)" when it waited for a CPU most of that time, "; it waited for a
// CPU 15 ms of it: ... stopped, or blocked in the kernel" when it did not; then "; the hypervisor
// took ..." and the quota's throttling, each where seen.

}  // namespace troupe
