#include "cpu_quota.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sim {

namespace {

constexpr long kPeriodUs = 100000;

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

CpuQuotaCgroup::CpuQuotaCgroup(const std::string& name, double cpus) {
  long quotaUs = std::lround(cpus * kPeriodUs);
  if (!(cpus > 0) || quotaUs < 1000) {
    why_ = "a CPU quota must be at least 0.01 CPUs, not " + std::to_string(cpus);
    return;
  }
  std::string v2, v1;
  cgroupMounts(v2, v1);
  if (!v2.empty() && readFile(v2 + "/cgroup.controllers").find("cpu") != std::string::npos) {
    writeTo(v2 + "/cgroup.subtree_control", "+cpu");
    if (mkdir((v2 + "/" + name).c_str(), 0755) != 0) {
      why_ = "cannot create the cgroup " + v2 + "/" + name + ": " + strerror(errno);
      return;
    }
    dir_ = v2 + "/" + name;
    if (!writeTo(dir_ + "/cpu.max", std::to_string(quotaUs) + " " + std::to_string(kPeriodUs))) {
      why_ = "cannot write " + dir_ + "/cpu.max";
    }
  } else if (!v1.empty()) {
    if (mkdir((v1 + "/" + name).c_str(), 0755) != 0) {
      why_ = "cannot create the cgroup " + v1 + "/" + name + ": " + strerror(errno);
      return;
    }
    dir_ = v1 + "/" + name;
    if (!writeTo(dir_ + "/cpu.cfs_period_us", std::to_string(kPeriodUs)) ||
        !writeTo(dir_ + "/cpu.cfs_quota_us", std::to_string(quotaUs))) {
      why_ = "cannot write " + dir_ + "/cpu.cfs_quota_us";
    }
  } else {
    why_ = "no cgroup hierarchy here has the cpu controller";
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
