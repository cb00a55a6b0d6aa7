#include "cpu_quota.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sim {

namespace {

// The quota is spent per period: a short one keeps a busy instance from running all its threads
// for a burst and then stalling (a serial trainer loses the stall); the kernel wants a quota of at
// least 1 ms, so a small quota gets a longer period.
constexpr long kShortPeriodUs = 20000, kLongPeriodUs = 100000, kMinQuotaUs = 1000;

bool writeTo(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return out.good();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The mount points of the cgroup v2 hierarchy and of the v1 hierarchy holding "cpu", if any.
void cgroupMounts(std::string& v2, std::string& v1) {
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mounts, line)) {
    std::stringstream ls(line);
    std::string id, parent, dev, root, point, word, type, source, opts;
    ls >> id >> parent >> dev >> root >> point;
    while (ls >> word && word != "-") {
    }
    ls >> type >> source >> opts;
    if (type == "cgroup2") v2 = point;
    if (type == "cgroup" && ("," + opts + ",").find(",cpu,") != std::string::npos) v1 = point;
  }
}

}  // namespace

CpuQuotaCgroup::CpuQuotaCgroup(const std::string& name, double cpus, bool capped)
    : capped_(capped) {
  long periodUs = std::clamp(long(std::ceil(kMinQuotaUs / std::max(cpus, 1e-6))), kShortPeriodUs,
                             kLongPeriodUs);
  long quotaUs = std::lround(cpus * periodUs);
  if (!(cpus > 0) || quotaUs < kMinQuotaUs) {
    why_ = "a CPU quota must be at least 0.01 CPUs, not " + std::to_string(cpus);
    return;
  }
  // Weight in proportion to the quota: when every instance is busy, the kernel shares the CPUs as
  // the quotas do (equal weights would give a 1-CPU instance and a 0.5-CPU one the same share).
  long weight = std::clamp(std::lround(cpus * 100), 1L, 10000L);
  std::string v2, v1;
  cgroupMounts(v2, v1);
  if (!v2.empty() && readFile(v2 + "/cgroup.controllers").find("cpu") != std::string::npos) {
    writeTo(v2 + "/cgroup.subtree_control", "+cpu");
    if (mkdir((v2 + "/" + name).c_str(), 0755) != 0) {
      why_ = "cannot create the cgroup " + v2 + "/" + name + ": " + strerror(errno);
      return;
    }
    dir_ = v2 + "/" + name;
    auto quota = capped ? std::to_string(quotaUs) : std::string("max");
    if (!writeTo(dir_ + "/cpu.max", quota + " " + std::to_string(periodUs))) {
      why_ = "cannot write " + dir_ + "/cpu.max";
    } else if (!writeTo(dir_ + "/cpu.weight", std::to_string(weight))) {
      why_ = "cannot write " + dir_ + "/cpu.weight";
    }
  } else if (!v1.empty()) {
    if (mkdir((v1 + "/" + name).c_str(), 0755) != 0) {
      why_ = "cannot create the cgroup " + v1 + "/" + name + ": " + strerror(errno);
      return;
    }
    dir_ = v1 + "/" + name;
    if (!writeTo(dir_ + "/cpu.cfs_period_us", std::to_string(periodUs)) ||
        !writeTo(dir_ + "/cpu.cfs_quota_us", capped ? std::to_string(quotaUs) : "-1") ||
        !writeTo(dir_ + "/cpu.shares", std::to_string(std::max(2L, weight * 1024 / 100)))) {
      why_ = "cannot write " + dir_ + "/cpu.cfs_quota_us";
    }
  } else {
    why_ = "no cgroup hierarchy here has the cpu controller";
  }
}

void CpuQuotaCgroup::removeStale() {
  std::string v2, v1;
  cgroupMounts(v2, v1);
  for (auto& root : {v2, v1}) {
    if (root.empty()) continue;
    std::error_code ec;
    for (auto& entry : std::filesystem::directory_iterator(root, ec)) {
      auto name = entry.path().filename().string();
      if (name.rfind("troupe-sim-", 0) != 0) continue;
      int owner = atoi(name.c_str() + strlen("troupe-sim-"));
      // Its simulator is gone (kill -9 skips the destructor). rmdir fails, harmlessly, while a
      // process is still in it.
      if (owner > 0 && kill(owner, 0) != 0 && errno == ESRCH) rmdir(entry.path().c_str());
    }
  }
}

CpuQuotaCgroup::~CpuQuotaCgroup() {
  if (!dir_.empty()) rmdir(dir_.c_str());
}

std::vector<std::string> CpuQuotaCgroup::wrap(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"/bin/sh", "-c",
                                  "echo $$ > '" + dir_ + "/cgroup.procs' && exec \"$@\"", "sh"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace sim
