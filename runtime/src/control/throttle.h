// How long a CPU quota held this process back: the cpu.stat files of its cgroup and of each
// ancestor (troupe/node_size.h, cgroupCpuStatFiles), read when asked. A control thread that
// stalled says with it whether the kernel's CPU bandwidth control (a Kubernetes CPU limit, a
// `troupe sim --cpu-quota`) was why: a quota's period refills at its rate, and time a thread spent
// past it in the kernel is a debt repaid before any thread of the cgroup runs again, so one long
// system call can freeze a whole process for seconds.

#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

class ThrottleWatch {
 public:
  ThrottleWatch();  // finds the files; none where no cgroup has the cpu controller

  struct Held {
    int64_t ms = 0;    // the most any one of the cgroups was throttled since the last mark()
    std::string file;  // that cgroup's cpu.stat
  };
  Held since() const;
  void mark();

 private:
  std::vector<std::string> files_;
  std::vector<uint64_t> marks_;
};

std::string throttleNote(const ThrottleWatch::Held& held);
// "; its cgroup's CPU quota throttled it 2168 ms since the heartbeat before (/sys/.../cpu.stat) ..."
// or "".

}  // namespace troupe
