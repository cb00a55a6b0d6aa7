#include "control/throttle.h"

#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "troupe/node_size.h"

namespace troupe {

namespace {

uint64_t throttledUs(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return parseThrottledUs(text.str()).value_or(0);
}

// run_delay of /proc/self/task/TID/schedstat ("runtime run_delay timeslices", in ns).
uint64_t runDelayNs(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  uint64_t runtime = 0, delay = 0;
  in >> runtime >> delay;
  return delay;
}

// Steal of `cpus` in /proc/stat ("cpuN user nice system idle iowait irq softirq steal ..."), in
// USER_HZ ticks.
uint64_t stealTicks(const std::vector<unsigned>& cpus) {
  std::ifstream in("/proc/stat");
  std::string line;
  uint64_t total = 0;
  while (std::getline(in, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] == ' ') continue;
    std::stringstream ls(line.substr(3));
    unsigned cpu = 0;
    uint64_t v[8] = {};
    ls >> cpu;
    for (auto& x : v) ls >> x;
    for (auto c : cpus) {
      if (c == cpu) total += v[7];
    }
  }
  return total;
}

}  // namespace

ThrottleWatch::ThrottleWatch() {
  try {
    files_ = cgroupCpuStatFiles();
  } catch (const std::exception&) {
    // No cgroup to read (a malformed mountinfo): nothing to say of a quota.
  }
  marks_.resize(files_.size());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus_.push_back(c);
    }
  }
  for (size_t i = 0; i < files_.size(); ++i) marks_[i] = throttledUs(files_[i]);
  stealMark_ = stealTicks(cpus_);
}

ThrottleWatch::Held ThrottleWatch::since() const {
  Held held;
  for (size_t i = 0; i < files_.size(); ++i) {
    uint64_t now = throttledUs(files_[i]);
    int64_t ms = now > marks_[i] ? int64_t((now - marks_[i]) / 1000) : 0;
    if (ms > held.ms) {
      held.ms = ms;
      held.file = files_[i];
    }
  }
  if (tid_ != 0) {
    uint64_t now = runDelayNs(tid_);
    held.runQueueMs = now > runDelayMark_ ? int64_t((now - runDelayMark_) / 1000000) : 0;
    if (gettid() != tid_) {
      // /proc/self/task/TID/stat: "tid (comm) S ...", the comm in parentheses may hold spaces.
      std::ifstream in("/proc/self/task/" + std::to_string(tid_) + "/stat");
      std::string line;
      std::getline(in, line);
      auto close = line.rfind(')');
      if (close != std::string::npos && close + 2 < line.size()) held.stateNow = line[close + 2];
    }
  }
  uint64_t steal = stealTicks(cpus_);
  held.stealMs = steal > stealMark_ ? int64_t((steal - stealMark_) * 1000 / sysconf(_SC_CLK_TCK))
                                    : 0;
  return held;
}

void ThrottleWatch::mark() {
  if (tid_ == 0) tid_ = gettid();
  for (size_t i = 0; i < files_.size(); ++i) marks_[i] = throttledUs(files_[i]);
  runDelayMark_ = runDelayNs(tid_);
  stealMark_ = stealTicks(cpus_);
}

std::string throttleNote(const ThrottleWatch::Held& held, int64_t stallMs) {
  std::string note;
  if (held.stateNow == 'R') {
    note += "; it is runnable and has not run since: waiting for a CPU";
  } else if (held.stateNow == 'D') {
    note += "; it is blocked in the kernel now (state D: a lock such as its memory map's, I/O)";
  } else if (held.stateNow == 'T' || held.stateNow == 't') {
    note += "; it is stopped now (SIGSTOP, a debugger)";
  } else if (held.runQueueMs > 0 && 2 * held.runQueueMs >= stallMs) {
    note += "; meanwhile it was runnable but not running for " +
            std::to_string(held.runQueueMs) + " ms (schedstat run_delay)";
  } else if (held.runQueueMs >= 0) {
    note += "; it waited for a CPU " + std::to_string(held.runQueueMs) +
            " ms of it (schedstat run_delay): the rest of the time the process was stopped "
            "(SIGSTOP, a cgroup freezer), or blocked in the kernel (a lock such as its memory "
            "map's, I/O)";
  }
  if (held.stealMs > 0) {
    note += "; the hypervisor took " + std::to_string(held.stealMs) +
            " ms of its CPUs (steal, /proc/stat)";
  }
  if (held.ms > 0) {
    note += "; its cgroup's CPU quota throttled it " + std::to_string(held.ms) + " ms (" +
            held.file +
            "): time spent past a quota is repaid with every thread of the cgroup stopped; give "
            "it more CPU, or a --node-timeout-ms above such stalls";
  }
  return note;
}

}  // namespace troupe
