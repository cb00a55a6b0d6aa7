// A node's size, labels and resources (troupe/node_size.h): the files it reads, fed from a
// temporary folder shaped like a machine, and the ceiling rule.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "temp_dir.h"
#include "troupe/config.h"
#include "troupe/node_size.h"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

// A folder shaped like a machine's /proc and /sys, removed at the end.
class FakeRoot {
 public:
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  void mkdir(const std::string& rel) { fs::create_directories(dir_ / rel); }
  const std::string& path() const { return dir_.path(); }

 private:
  troupe::testing::TempDir dir_{"troupe-node-size"};
};

// A process in cgroup v2's /job/step, cgroup2 mounted at /sys/fs/cgroup, on CPUs 0-7, 16 GiB.
void cgroupV2Machine(FakeRoot& r) {
  r.write("proc/self/mountinfo",
          "24 1 0:21 / /sys rw - sysfs sysfs rw\n"
          "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  r.write("proc/self/cgroup", "0::/job/step\n");
  r.write("proc/self/status", "Name:\tx\nCpus_allowed_list:\t0-7\nMems_allowed_list:\t0\n");
  r.write("proc/meminfo", "MemTotal:       16777216 kB\nMemFree:  1 kB\n");
  r.write("sys/fs/cgroup/cpu.max", "max 100000\n");
  r.write("sys/fs/cgroup/job/cpu.max", "300000 100000\n");
  r.write("sys/fs/cgroup/job/step/cpu.max", "max 100000\n");
  r.write("sys/fs/cgroup/job/memory.max", "max\n");
  r.write("sys/fs/cgroup/job/step/memory.max", "4294967296\n");
}

}  // namespace

TEST_CASE("cpu.max is quota over period rounded up, max is no limit", "[node-size]") {
  CHECK(parseCpuMax("100000 100000\n", "cpu.max") == 1u);
  CHECK(parseCpuMax("150000 100000", "cpu.max") == 2u);
  CHECK(parseCpuMax("50000 100000", "cpu.max") == 1u);
  CHECK(parseCpuMax("max 100000", "cpu.max") == std::nullopt);
  CHECK_THROWS_WITH(parseCpuMax("lots", "/sys/fs/cgroup/cpu.max"),
                    Catch::StartsWith("/sys/fs/cgroup/cpu.max 'lots' is not a cgroup v2 cpu.max"));
  CHECK(parseCfsQuota("-1\n", "100000\n", "q") == std::nullopt);
  CHECK(parseCfsQuota("250000", "100000", "q") == 3u);
}

TEST_CASE("memory.max is bytes or max, MemTotal is kB", "[node-size]") {
  CHECK(parseMemoryMax("4294967296\n", "memory.max") == 4294967296ull);
  CHECK(parseMemoryMax("max\n", "memory.max") == std::nullopt);
  CHECK_THROWS_WITH(parseMemoryMax("4G", "memory.max"),
                    "memory.max '4G' is not a memory limit: expected bytes or \"max\"");
  CHECK(parseMemTotal("MemTotal:  2048 kB\n") == 2048ull * 1024);
  CHECK(parseMemTotal("MemFree: 1 kB\n") == std::nullopt);
}

TEST_CASE("the cgroup's lowest quota along its ancestors, the affinity mask and memory are found",
          "[node-size]") {
  FakeRoot r;
  cgroupV2Machine(r);
  auto m = probeMachine(r.path());
  CHECK(m.cgroupCpus == 3u);
  CHECK(m.cgroupCpusFrom == r.path() + "/sys/fs/cgroup/job/cpu.max '300000 100000'");
  CHECK(m.affinityCpus == 8u);
  CHECK(m.cgroupMemory == 4294967296ull);
  CHECK(m.memTotal == 16ull << 30);
  CHECK(m.gpus == 0u);
  CHECK(m.gpusFrom == r.path() + "/proc/driver/nvidia/gpus (absent: no NVIDIA driver)");
}

TEST_CASE("cgroup v1 quotas and memory limits are read where v1 holds the controllers",
          "[node-size]") {
  FakeRoot r;
  r.write("proc/self/mountinfo",
          "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
          "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  r.write("proc/self/cgroup", "4:memory:/slurm/job_7\n2:cpu,cpuacct:/slurm/job_7\n0::/\n");
  r.write("sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us", "200000\n");
  r.write("sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cpu.cfs_period_us", "100000\n");
  r.write("sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes", "1073741824\n");
  r.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto m = probeMachine(r.path());
  CHECK(m.cgroupCpus == 2u);
  CHECK(m.cgroupMemory == 1ull << 30);
}

TEST_CASE("the time a CPU quota throttled is read from cpu.stat along the cgroup's ancestors",
          "[node-size]") {
  CHECK(parseThrottledUs("usage_usec 9\nnr_throttled 3\nthrottled_usec 4053000\n") == 4053000u);
  CHECK(parseThrottledUs("nr_periods 5\nnr_throttled 2\nthrottled_time 2500000\n") == 2500u);
  CHECK(parseThrottledUs("usage_usec 9\n") == std::nullopt);
  FakeRoot r;
  cgroupV2Machine(r);
  r.write("sys/fs/cgroup/job/cpu.stat", "throttled_usec 7\n");
  r.write("sys/fs/cgroup/job/step/cpu.stat", "throttled_usec 0\n");
  auto files = cgroupCpuStatFiles(r.path());
  CHECK(files == std::vector<std::string>{r.path() + "/sys/fs/cgroup/job/step/cpu.stat",
                                          r.path() + "/sys/fs/cgroup/job/cpu.stat"});
}

TEST_CASE("a container's cgroup namespace mount starts at the container's cgroup", "[node-size]") {
  FakeRoot r;
  r.write("proc/self/mountinfo",
          "30 24 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  r.write("proc/self/cgroup", "0::/kubepods/pod1\n");
  r.write("sys/fs/cgroup/cpu.max", "100000 100000\n");
  CHECK(probeMachine(r.path()).cgroupCpus == 1u);
}

TEST_CASE("GPUs are the entries of /proc/driver/nvidia/gpus, Neuron devices those of /dev",
          "[node-size]") {
  FakeRoot r;
  r.mkdir("proc/driver/nvidia/gpus/0000:00:1e.0");
  r.mkdir("proc/driver/nvidia/gpus/0000:00:1f.0");
  r.write("dev/neuron0", "");
  r.write("dev/neuron1", "");
  r.write("dev/neuronx", "");
  auto m = probeMachine(r.path());
  CHECK(m.gpus == 2u);
  CHECK(m.neuronDevices == 2u);
}

TEST_CASE("a node reports never more than its instance type claims, and lower figures say so",
          "[node-size]") {
  FakeRoot r;
  cgroupV2Machine(r);
  auto m = probeMachine(r.path());
  // ml.c5.xlarge: 4 vCPUs, 8 GiB. The cgroup allows 3 CPUs and 4 GiB.
  auto small = sizeNode("ml.c5.xlarge", m, {});
  CHECK(small.vcpus.value == 3);
  CHECK(small.vcpus.source == "cgroup");
  CHECK(small.memoryBytes.value == 4ull << 30);
  CHECK(small.memoryBytes.source == "cgroup");
  CHECK(small.gpus.value == 0);
  CHECK(small.gpus.source == "table");
  REQUIRE(small.notes.size() == 2);
  CHECK(small.notes[0] == "vcpus: instance type ml.c5.xlarge claims 4 but this machine allows 3 (" +
                              r.path() +
                              "/sys/fs/cgroup/job/cpu.max '300000 100000'); reporting 3");
  // A type smaller than the machine: the table's figures.
  auto big = sizeNode("ml.c5.xlarge", MachineFacts{.affinityCpus = 64, .memTotal = 1ull << 40}, {});
  CHECK(big.vcpus.value == 4);
  CHECK(big.vcpus.source == "table");
  CHECK(big.memoryBytes.value == 8ull << 30);
  CHECK(big.notes.empty());
  // The GPU type on a machine without a driver reports 0 GPUs.
  auto gpu = sizeNode("ml.p3.2xlarge", MachineFacts{.affinityCpus = 8, .memTotal = 1ull << 40}, {});
  CHECK(gpu.gpus.value == 0);
  CHECK(gpu.gpus.source == "nvidia");
  // No type: the machine.
  auto bare = sizeNode("", m, {});
  CHECK(bare.vcpus.value == 3);
  CHECK(bare.notes.empty());
}

TEST_CASE("flags replace the machine's figures, even above them, but not the type's ceiling",
          "[node-size]") {
  MachineFacts m{.affinityCpus = 2, .memTotal = 1ull << 40};
  auto emulated = sizeNode("ml.p3.2xlarge", m, {.vcpus = 8, .gpus = 1, .memoryBytes = 61ull << 30});
  CHECK(emulated.vcpus.value == 8);
  CHECK(emulated.vcpus.source == "flag");
  CHECK(emulated.gpus.value == 1);
  CHECK(emulated.gpus.source == "flag");
  CHECK(emulated.notes.empty());
  auto over = sizeNode("ml.c5.xlarge", m, {.vcpus = 16});
  CHECK(over.vcpus.value == 4);
  CHECK(over.vcpus.source == "table");
  REQUIRE(over.notes.size() == 1);
  CHECK(over.notes[0] ==
        "vcpus: --vcpus (TROUPE_VCPUS) asks for 16 but instance type ml.c5.xlarge has 4; "
        "reporting 4");
}

TEST_CASE("labels parse as KEY=VALUE lists, bad ones name the flag, the value and the form",
          "[node-size][bad-input]") {
  CHECK(parseLabels("zone=a,disk=nvme", "--labels") == NodeLabels{{"disk", "nvme"}, {"zone", "a"}});
  CHECK(parseLabels("", "--labels").empty());
  CHECK(formatLabels(parseLabels("zone=a,disk=nvme", "--labels")) == "disk=nvme,zone=a");
  CHECK_THROWS_WITH(parseLabels("zone", "--labels"),
                    "--labels 'zone': entry 'zone' has no '='; expected KEY=VALUE[,KEY=VALUE...], "
                    "e.g. zone=a,disk=nvme");
  CHECK_THROWS_WITH(
      parseLabels("zone=a b", "--labels"),
      Catch::StartsWith("--labels 'zone=a b': 'a b' is not a value for label 'zone'"));
  CHECK_THROWS_WITH(parseLabels("group=x", "TROUPE_LABELS"),
                    Catch::StartsWith("TROUPE_LABELS 'group=x': label 'group' is set by troupe"));
  CHECK_THROWS_WITH(parseLabels("a=1,a=2", "--labels"),
                    Catch::Contains("label 'a' is given twice"));
}

TEST_CASE("resources parse as NAME=AMOUNT lists, bad ones name the flag, the value and the form",
          "[node-size][bad-input]") {
  CHECK(parseResources("fpga=2,nvme=0.5", "--resources") ==
        NodeResources{{"fpga", 2.0}, {"nvme", 0.5}});
  CHECK(formatResources({{"fpga", 2.0}, {"nvme", 0.5}}) == "fpga=2,nvme=0.5");
  CHECK_THROWS_WITH(parseResources("fpga=x", "--resources"),
                    "--resources 'fpga=x': 'x' is not an amount for 'fpga'; expected "
                    "NAME=AMOUNT[,NAME=AMOUNT...] with AMOUNT like 2 or 0.5, e.g. fpga=2 (at most "
                    "3 decimals)");
  CHECK_THROWS_WITH(parseResources("fpga=0.0001", "--resources"),
                    Catch::Contains("'0.0001' is not an amount for 'fpga'"));
  CHECK_THROWS_WITH(parseResources("fpga=0", "--resources"),
                    Catch::Contains("resource 'fpga' must be more than 0"));
  CHECK_THROWS_WITH(parseResources("gpu=1", "TROUPE_RESOURCES"),
                    Catch::Contains("set it with --vcpus, --gpus or --memory-bytes"));
}
