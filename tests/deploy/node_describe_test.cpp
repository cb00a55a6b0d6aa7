// Nodes describe themselves truthfully (troupe/node_size.h), with real processes: a node in a
// cgroup limited to 1 CPU, or pinned to one CPU, reports 1 vCPU; labels and custom resources set
// per instance reach the head's scheduler, and placements that need them land only where they
// are; bad --labels / --resources are exit 2 naming the flag, the value and the form.
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "cpu_quota.h"
#include "deploy_util.h"

using namespace std::chrono_literals;
using deploy::count;
using nlohmann::json;

namespace {

unsigned machineCpus() {
  cpu_set_t set;
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

// A child cgroup whose CPU quota is one CPU (troupe sim's --cpu-quota cgroup, cpu_quota.h),
// removed at the end. `why` says why there is none.
class OneCpuCgroup {
 public:
  OneCpuCgroup() : cgroup_("troupe-node-test-" + std::to_string(getpid()), 1.0) {
    dir = cgroup_.dir();
    why = cgroup_.why();
    if (why.empty()) {
      // Moving a process in can still be refused (a delegated or read-only hierarchy).
      auto probe = "echo $$ > " + dir + "/cgroup.procs 2>/dev/null";
      if (system(("sh -c '" + probe + "'").c_str()) != 0) {
        why = "cannot move a process into " + dir + " (not delegated to us)";
      }
    }
    if (!why.empty()) why = "skipping: " + why;
  }
  std::vector<std::string> wrap(std::vector<std::string> argv) const { return cgroup_.wrap(argv); }

  std::string dir, why;

 private:
  sim::CpuQuotaCgroup cgroup_;
};

// `troupe env`'s "node" object, run with `argv` (a wrapper, then troupe env) and `env`.
json troupeEnvNode(std::vector<std::string> argv, std::vector<std::string> env = {}) {
  harness::Run run(argv, env);
  int code = run.wait(20s);
  INFO(run.output());
  REQUIRE(code == 0);
  auto out = run.output();
  auto node = json::parse(out.substr(out.find('{')))["node"];
  CHECK_FALSE(harness::processExists(run.pid()));
  return node;
}

// A one-host cluster file of instance type `type`, for `troupe env --cluster`.
std::string oneHost(const roots::TempDir& dir, const std::string& type) {
  auto path = dir / "cluster.json";
  roots::writeFile(path, R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "g", "current_instance_type": ")" +
                             type + R"(", "labels": {"zone": "a", "disk": "ssd"}})");
  return path;
}

std::string hostOfGroup(const harness::Run& run, const std::string& group) {
  for (auto& [host, i] : run.instances()) {
    if (i.group == group) return host;
  }
  return "";
}

}  // namespace

TEST_CASE("a node in a cgroup limited to 1 CPU reports 1 vCPU, under its type's 4", "[node-size]") {
  if (machineCpus() < 2) {
    WARN("skipping: this machine has 1 CPU, so a 1-CPU limit could not lower anything");
    return;
  }
  OneCpuCgroup cgroup;
  if (!cgroup.why.empty()) {
    WARN(cgroup.why);
    return;
  }
  roots::TempDir dir;
  // troupe env, as the node would see it.
  auto node = troupeEnvNode(
      cgroup.wrap({harness::troupeBinary(), "env", "--cluster", oneHost(dir, "ml.c5.xlarge")}));
  INFO(node.dump(2));
  CHECK(node["vcpus"]["value"] == 1);
  CHECK(node["vcpus"]["source"] == "cgroup");
  CHECK(node["notes"][0].get<std::string>().find(
            "vcpus: instance type ml.c5.xlarge claims 4 but this machine allows 1") == 0);

  // A real node: the head (it is one) knows it as 1 vCPU, and its log says why.
  auto root = roots::makeRoot(dir / "node", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "g", "current_instance_type": "ml.c5.xlarge"})");
  harness::Run run(cgroup.wrap({deploy::smApp()}),
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(20s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("NODEINFO algo-1 vcpus=1 ") != std::string::npos);
  CHECK(out.find("vcpus: instance type ml.c5.xlarge claims 4 but this machine allows 1 (" +
                 cgroup.dir) != std::string::npos);
  CHECK_FALSE(harness::processExists(run.pid()));
}

TEST_CASE("a node pinned to one CPU (taskset -c 0) reports 1 vCPU from its affinity mask",
          "[node-size]") {
  if (machineCpus() < 2) {
    WARN("skipping: this machine has 1 CPU, so pinning to one could not lower anything");
    return;
  }
  std::string taskset = "/usr/bin/taskset";
  if (!std::filesystem::exists(taskset)) {
    WARN("skipping: no " + taskset + " (util-linux) here");
    return;
  }
  roots::TempDir dir;
  auto node = troupeEnvNode(
      {taskset, "-c", "0", harness::troupeBinary(), "env", "--cluster", oneHost(dir, "")});
  INFO(node.dump(2));
  CHECK(node["vcpus"]["value"] == 1);
  CHECK(node["vcpus"]["source"] == "affinity");
  CHECK(node["vcpus"]["detail"] == "sched_getaffinity 0");

  // Unpinned, the same node reports every CPU it may use.
  auto free = troupeEnvNode({harness::troupeBinary(), "env", "--cluster", oneHost(dir, "")});
  CHECK(free["vcpus"]["value"] == machineCpus());
}

TEST_CASE("troupe env says where each figure came from: table, machine, cluster file, flag",
          "[node-size]") {
  roots::TempDir dir;
  // ml.p3.2xlarge claims 8 vCPUs and a GPU; a flag asks for 1 vCPU, the environment for labels.
  auto node =
      troupeEnvNode({harness::troupeBinary(), "env", "--cluster", oneHost(dir, "ml.p3.2xlarge"),
                     "--vcpus", "1", "--resources", "fpga=2"},
                    {"TROUPE_LABELS=zone=b"});
  INFO(node.dump(2));
  CHECK(node["instance_type"] == "ml.p3.2xlarge");
  CHECK(node["vcpus"]["value"] == 1);
  CHECK(node["vcpus"]["source"] == "flag");
  // This machine has no NVIDIA driver: 0 GPUs, said so, below the type's 1.
  if (!std::filesystem::exists("/proc/driver/nvidia/gpus")) {
    CHECK(node["gpus"]["value"] == 0);
    CHECK(node["gpus"]["detail"].get<std::string>().find(
              "/proc/driver/nvidia/gpus (absent: no NVIDIA driver)") != std::string::npos);
  }
  CHECK(node["labels"]["zone"] == json({{"value", "b"}, {"source", "flag"}}));
  CHECK(node["labels"]["disk"] == json({{"value", "ssd"}, {"source", "cluster file"}}));
  CHECK(node["resources"]["fpga"] == json({{"value", 2.0}, {"source", "flag"}}));
  std::set<std::string> memorySources = {"table", "cgroup", "meminfo"};
  CHECK(memorySources.count(node["memory_bytes"]["source"]) == 1);
}

TEST_CASE("labels and resources reach the scheduler: a spawn needing fpga lands only on its node",
          "[node-size][labels]") {
  std::vector<std::string> cluster = {
      "--group", "a=1:ml.c5.xlarge",          "--group",      "b=1:ml.c5.xlarge",
      "--group", "f=1:ml.c5.xlarge",          "--head-group", "a",
      "--env",   "f:TROUPE_RESOURCES=fpga=2", "--env",        "b:TROUPE_LABELS=disk=nvme,zone=b"};
  auto with = [&](std::vector<std::string> more) {
    auto args = cluster;
    args.insert(args.end(), more.begin(), more.end());
    return harness::sim(args, {deploy::smApp()});
  };

  harness::Run fpga(
      with({"--hp", "place=any().cpus(0).resource(fpga, 1)", "--hp", "place_count=2"}));
  CHECK(fpga.wait(40s) == 0);
  auto out = fpga.output();
  INFO(out);
  auto f = hostOfGroup(fpga, "f"), b = hostOfGroup(fpga, "b");
  REQUIRE_FALSE(f.empty());
  // What the head holds for each node: the sim's emulated size (the table's, on any machine) and
  // the instance's own labels and resources.
  CHECK(out.find("NODEINFO " + f + " vcpus=4 gpus=0 labels=- resources=fpga=2.000000") !=
        std::string::npos);
  CHECK(out.find("NODEINFO " + b + " vcpus=4 gpus=0 labels=disk=nvme,zone=b resources=-") !=
        std::string::npos);
  CHECK(count(out, "PLACED " + f) == 2);
  CHECK(count(out, "PLACED ") == 2);
  CHECK(fpga.leftovers().empty());

  // A third fpga actor does not fit: the job fails with the scheduler's reason.
  harness::Run over(
      with({"--hp", "place=any().cpus(0).resource(fpga, 1)", "--hp", "place_count=3"}));
  CHECK(over.wait(40s) != 0);
  auto overOut = over.output();
  INFO(overOut);
  CHECK(overOut.find("cannot place 'sm.Reporter': no node has 1 free fpga") != std::string::npos);
  CHECK(count(overOut, "PLACED ") == 0);
  CHECK(over.leftovers().empty());

  harness::Run labelled(
      with({"--hp", "place=any().cpus(0).labels(\"disk=nvme\")", "--hp", "place_count=3"}));
  CHECK(labelled.wait(40s) == 0);
  auto labelledOut = labelled.output();
  INFO(labelledOut);
  auto b2 = hostOfGroup(labelled, "b");
  CHECK(count(labelledOut, "PLACED " + b2) == 3);
  CHECK(count(labelledOut, "PLACED ") == 3);
  CHECK(labelled.leftovers().empty());
}

TEST_CASE("bad --labels and --resources: exit 2 naming the flag, the value and the form",
          "[node-size][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "x", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "g", "current_instance_type": "ml.c5.xlarge"})");
  deploy::expectConfigError(deploy::runNode(root, {}, {"--resources", "fpga=x"}),
                            "--resources (TROUPE_RESOURCES) 'fpga=x': 'x' is not an amount for "
                            "'fpga'; expected NAME=AMOUNT[,NAME=AMOUNT...] with AMOUNT like 2 or "
                            "0.5, e.g. fpga=2 (at most 3 decimals)");
  deploy::expectConfigError(deploy::runNode(root, {"TROUPE_LABELS=zone"}),
                            "--labels (TROUPE_LABELS) 'zone': entry 'zone' has no '='; expected "
                            "KEY=VALUE[,KEY=VALUE...], e.g. zone=a,disk=nvme");
  // troupe env says the same.
  harness::Run env({harness::troupeBinary(), "env", "--cluster",
                    root + "/input/config/resourceconfig.json", "--resources", "fpga=x"});
  CHECK(env.wait(10s) == 2);
  CHECK(env.output().find("troupe env: --resources (TROUPE_RESOURCES) 'fpga=x': 'x' is not an "
                          "amount") != std::string::npos);
}

TEST_CASE("troupe env --torchrun prints the environment a torchrun script starts with on this host",
          "[deploy][torchrun]") {
  // What SageMaker's train and troupe-node add before a script starts (troupe/torchrun.h): a
  // training instance its rank, a data instance a world of one, the job's MASTER_PORT kept.
  roots::TempDir dir("troupe-env-torchrun");
  auto cluster = [&](const std::string& host, const std::string& group) {
    auto path = dir / (host + ".json");
    roots::writeFile(path, R"({"current_host": ")" + host + R"(", "current_group_name": ")" +
                               group + R"(", "hosts": ["algo-1", "algo-2", "algo-3"],
        "network_interface_name": "eth0", "instance_groups": [
        {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge",
         "hosts": ["algo-3", "algo-2"]},
        {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge",
         "hosts": ["algo-1"]}]})");
    return path;
  };
  harness::Run rank({harness::troupeBinary(), "env", "--torchrun", "--cluster",
                     cluster("algo-3", "dnn_group")},
                    {"MASTER_PORT=23456"});
  REQUIRE(rank.wait(20s) == 0);
  auto out = rank.output();
  INFO(out);
  for (auto line : {"RANK=1\n", "WORLD_SIZE=2\n", "LOCAL_RANK=0\n", "MASTER_ADDR=algo-2\n",
                    "MASTER_PORT=23456\n", "GLOO_SOCKET_IFNAME=eth0\n", "TROUPE_DDP_ROLE=rank\n"}) {
    CHECK(out.find(line) != std::string::npos);
  }
  harness::Run data({harness::troupeBinary(), "env", "--torchrun", "--cluster",
                     cluster("algo-1", "data_group")});
  REQUIRE(data.wait(20s) == 0);
  auto alone = data.output();
  INFO(alone);
  for (auto line : {"RANK=0\n", "WORLD_SIZE=1\n", "MASTER_ADDR=127.0.0.1\n",
                    "TROUPE_DDP_ROLE=data\n"}) {
    CHECK(alone.find(line) != std::string::npos);
  }
}
