// bench_pipeline's small helpers (bench_pipeline.h).

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "bench_pipeline.h"

namespace bench_pipeline {

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string cpuList(const cpu_set_t& set) {
  std::string out;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    unsigned end = c;
    while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) ++end;
    if (!out.empty()) out += ",";
    out += end == c ? std::to_string(c) : std::to_string(c) + "-" + std::to_string(end);
    c = end;
  }
  return out;
}

std::vector<unsigned> allowedCpus() {
  cpu_set_t set;
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

std::string tail(const std::string& text, size_t lines) {
  if (text.empty()) return text;
  size_t at = text.size();
  for (size_t i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

std::map<unsigned, double> cpuBusySeconds() {
  static const long ticks = sysconf(_SC_CLK_TCK);
  std::map<unsigned, double> busy;
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !isdigit(line[3])) continue;
    std::istringstream in(line.substr(3));
    unsigned cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    busy[cpu] = (user + nice + system + irq + softirq + steal) / ticks;
  }
  return busy;
}

double loadAverage() {
  double l = 0;
  std::ifstream("/proc/loadavg") >> l;
  return l;
}

volatile sig_atomic_t gSignal = 0;
volatile pid_t gChild = 0;

void onSignal(int sig) {
  gSignal = sig;
  pid_t child = gChild;
  if (child > 0) kill(child, SIGTERM);  // `troupe sim` cascades it to its instances
}

}  // namespace bench_pipeline
