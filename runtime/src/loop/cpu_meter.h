// File: cpu_meter.h
//
// How busy this process is: the CPU time all its threads used (user + system, getrusage) over the
// wall-clock time since the previous sample. Nodes sample it once per heartbeat, so `troupe status`
// shows each node's CPU use over its last heartbeat interval. Private to the runtime.

#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>

namespace troupe {

class CpuMeter {
 public:
  CpuMeter() : lastWall_(std::chrono::steady_clock::now()), lastCpu_(cpuTime()) {}

  struct Sample {
    float percent = 0;        // % of one core: a process that keeps two threads busy shows 200
    uint32_t intervalMs = 0;  // the wall-clock time it covers
  };

  Sample sample() {
    auto wall = std::chrono::steady_clock::now();
    auto cpu = cpuTime();
    auto wallUs = std::chrono::duration_cast<std::chrono::microseconds>(wall - lastWall_).count();
    Sample s;
    s.intervalMs = static_cast<uint32_t>(wallUs / 1000);
    if (wallUs > 0) s.percent = static_cast<float>(100.0 * (cpu - lastCpu_) / wallUs);
    lastWall_ = wall;
    lastCpu_ = cpu;
    return s;
  }

 private:
  static int64_t cpuTime() {
    // Microseconds of CPU used by every thread of this process, alive or ended.
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
    auto us = [](const timeval& t) { return int64_t(t.tv_sec) * 1000000 + t.tv_usec; };
    return us(u.ru_utime) + us(u.ru_stime);
  }

  std::chrono::steady_clock::time_point lastWall_;
  int64_t lastCpu_;
};

}  // namespace troupe
