// Clocks the trainer's files share: a thread's or the process's CPU seconds, a kj duration in
// seconds.

#pragma once

#include <time.h>

#include <kj/time.h>

namespace troupe::train {

inline double cpuSeconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

inline double seconds(kj::Duration d) {
  return d / kj::NANOSECONDS / 1e9;
}

}  // namespace troupe::train
