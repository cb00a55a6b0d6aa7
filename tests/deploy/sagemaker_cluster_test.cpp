// The same app binary in 3 emulated SageMaker instances (2 groups, shuffled host names), started
// from their roots only: the group each found, exit codes, success and failure files. Also host
// names that do not resolve, and listening on the configured interface.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "deploy_util.h"

using namespace std::chrono_literals;
using deploy::count;

namespace {

const std::vector<std::pair<std::string, std::string>> kThree = {
    {"data_group", "ml.c5.xlarge"}, {"data_group", "ml.c5.xlarge"}, {"dnn_group", "ml.p3.2xlarge"}};

std::string nodeLine(const std::string& out, const std::string& host) {
  auto at = out.find("NODE " + host + " ");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

bool listening(const std::string& hexAddress) {
  // /proc/net/tcp: "sl local_address rem_address st ...", state 0A is LISTEN.
  std::ifstream in("/proc/net/tcp");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(" " + hexAddress + " ") != std::string::npos &&
        line.find(" 0A ") != std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string hexPort(unsigned port) {
  char buf[8];
  snprintf(buf, sizeof(buf), "%04X", port);
  return buf;
}

}  // namespace

TEST_CASE("3 instances from SageMaker roots: each finds its group, all exit 0, success files",
          "[sagemaker][cluster]") {
  deploy::Cluster cluster(kThree, R"({"epochs": "3", "layers": "[256,128]", "name": "abc"})");
  for (auto& h : cluster.hosts) std::filesystem::create_directories(h.root + "/input/data/train");
  auto runs = cluster.start();
  std::string all;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto& h = cluster.hosts[i];
    INFO(h.name << " " << h.group);
    CHECK(runs[i]->wait(30s) == 0);
    auto out = runs[i]->output();
    INFO(out);
    all += out;
    // The logger's tag says which host and group this process found in its root.
    CHECK(out.find("[" + h.name + " " + h.group +
                   (h.group == "dnn_group" ? " head]" : " worker]")) != std::string::npos);
    CHECK(std::filesystem::exists(h.root + "/output/success"));
    CHECK_FALSE(std::filesystem::exists(h.root + "/output/failure"));
    CHECK_FALSE(harness::processExists(runs[i]->pid()));
  }
  INFO(all);
  // Every node's actor read the same hyperparameters (decoded) and channels from its own root.
  for (auto& h : cluster.hosts) {
    CHECK(nodeLine(all, h.name) == "NODE " + h.name + " group=" + h.group + " type=" + h.type +
                                       " sm=yes epochs=3 layers=[256,128] name=abc channels=train");
    CHECK(all.find("PING " + h.name + " " + h.group) != std::string::npos);
  }
}

TEST_CASE("an actor failing on one instance: every process exits 1, every failure file says why",
          "[sagemaker][cluster][fault]") {
  deploy::Cluster cluster(kThree, R"({"crash_group": "data_group"})");
  auto runs = cluster.start();
  std::string reason;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto& h = cluster.hosts[i];
    INFO(h.name << " " << h.group << "\n" << runs[i]->output());
    CHECK(runs[i]->wait(30s) == 1);  // JOB_FAILED
    REQUIRE(std::filesystem::exists(h.root + "/output/failure"));
    CHECK_FALSE(std::filesystem::exists(h.root + "/output/success"));
    auto line = roots::firstLine(h.root + "/output/failure");
    // The one line: which actor, on which host, and why; the same on every node.
    CHECK(line.find("boom on algo-") != std::string::npos);
    CHECK(line.find("sm.Reporter") != std::string::npos);
    if (reason.empty()) reason = line;
    CHECK(line == reason);
    CHECK(roots::readFile(h.root + "/output/failure")
              .find("exit code 1 (JOB_FAILED) on " + h.name + " (" + h.group + ")") !=
          std::string::npos);
    CHECK_FALSE(harness::processExists(runs[i]->pid()));
  }
}

TEST_CASE("kill -9 of a data instance: the others exit non-zero, their failure files name it",
          "[sagemaker][cluster][fault]") {
  deploy::Cluster cluster(kThree, R"({"hold_ms": "30000"})");
  auto runs = cluster.start();
  size_t head = 0, victim = 0;
  for (size_t i = 0; i < cluster.hosts.size(); ++i) {
    if (cluster.hosts[i].group == "dnn_group") head = i;
    if (cluster.hosts[i].group == "data_group") victim = i;
  }
  REQUIRE_OUTPUT(*runs[head], "PING", 30s);
  REQUIRE_OUTPUT(*runs[victim], "NODE " + cluster.hosts[victim].name, 10s);
  REQUIRE(kill(runs[victim]->pid(), SIGKILL) == 0);
  CHECK(runs[victim]->wait(5s) == 128 + SIGKILL);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i == victim) continue;
    auto& h = cluster.hosts[i];
    INFO(h.name << " " << h.group << "\n" << runs[i]->output());
    CHECK(runs[i]->wait(20s) != 0);
    REQUIRE(std::filesystem::exists(h.root + "/output/failure"));
    CHECK(roots::firstLine(h.root + "/output/failure").find(cluster.hosts[victim].name) !=
          std::string::npos);
    CHECK_FALSE(harness::processExists(runs[i]->pid()));
  }
  // SIGKILL leaves no file: SageMaker reports that instance itself.
  CHECK_FALSE(std::filesystem::exists(cluster.hosts[victim].root + "/output/success"));
}

TEST_CASE("a head name that does not resolve is retried until the join deadline",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  // algo-1 (the head, in the GPU group) has no host map entry and no DNS name here.
  auto root =
      roots::makeRoot(dir / "algo-2", R"({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"],
      "current_group_name": "data_group", "instance_groups": [
        {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-1"]},
        {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge", "hosts": ["algo-2"]}]})");
  roots::writeFile(dir / "hosts.json",
                   R"({"algo-2": "127.0.0.1:)" + std::to_string(deploy::freePort()) + "\"}");
  roots::writeChannelSecret(root);
  auto started = std::chrono::steady_clock::now();
  harness::Run run({deploy::smApp()},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_HOST_MAP=" + (dir / "hosts.json"),
                    "TROUPE_JOIN_TIMEOUT_MS=1500", "TROUPE_LOG_LEVEL=debug"});
  CHECK(run.wait(15s) == 5);  // JOIN_FAILED
  auto took = std::chrono::steady_clock::now() - started;
  auto out = run.output();
  INFO(out);
  CHECK(took >= 1400ms);  // not given up at the first failed lookup
  CHECK(count(out, "retrying in") >= 3);
  auto failure = roots::firstLine(root + "/output/failure");
  CHECK(failure.find("could not join the head algo-1 at algo-1:7077 within 1500 ms") == 0);
  CHECK(failure.find("DNS lookup failed") != std::string::npos);
}

TEST_CASE("a node listens on the interface the config names, not on every address",
          "[sagemaker][network]") {
  roots::TempDir dir;
  auto port = deploy::freePort();
  auto rc = [](const std::string& iface) {
    return R"({"current_host": "algo-1", "hosts": ["algo-1"], "current_group_name": "g",
               "current_instance_type": "ml.c5.xlarge", "network_interface_name": ")" +
           iface + "\"}";
  };
  auto root = roots::makeRoot(dir / "lo", rc("lo"), R"({"hold_ms": "1500"})");
  {
    harness::Run run({deploy::smApp()},
                     {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(port)});
    REQUIRE_OUTPUT(run, "PING", 10s);
    CHECK(listening("0100007F:" + hexPort(port)));  // 127.0.0.1, lo's address
    CHECK_FALSE(listening("00000000:" + hexPort(port)));
    CHECK(run.wait(10s) == 0);
  }
  auto missing = roots::makeRoot(dir / "nosuch", rc("nosuch0"));
  harness::Run run({deploy::smApp()},
                   {"TROUPE_SM_ROOT=" + missing, "TROUPE_PORT=" + std::to_string(port)});
  CHECK(run.wait(10s) == 0);
  INFO(run.output());
  CHECK(run.output().find("network interface 'nosuch0' (network_interface_name in " + missing +
                          "/input/config/resourceconfig.json) does not exist or has no IPv4 "
                          "address; listening on every address") != std::string::npos);
}

TEST_CASE("a homogeneous SageMaker cluster runs hetero_train unchanged: the head falls back",
          "[sagemaker][cluster][homogeneous]") {
  // SageMaker's homogeneous job: no instance_groups, current_group_name "homogeneousCluster".
  // hetero_train's head group (dnn_group) is not there: the default head (the first host) runs
  // the driver and the trainer, with one warning line, and every instance exits 0.
  roots::TempDir dir;
  const std::vector<std::string> hosts = {"algo-1", "algo-2"};
  deploy::json map = deploy::json::object();
  for (auto& h : hosts) map[h] = "127.0.0.1:" + std::to_string(deploy::freePort());
  roots::writeFile(dir / "hosts.json", map.dump());
  std::vector<std::unique_ptr<harness::Run>> runs;
  std::vector<std::string> rootOf;
  for (auto& h : hosts) {
    deploy::json rc = {{"current_host", h},
                       {"current_group_name", "homogeneousCluster"},
                       {"current_instance_type", "ml.c5.xlarge"},
                       {"hosts", hosts},
                       {"network_interface_name", "eth0"}};
    rootOf.push_back(
        roots::makeRoot(dir / h, rc.dump(),
                        R"({"epochs": "1", "train_samples": "2000", "augmenters_per_node": "1",
            "sagemaker_program": "train", "sagemaker_region": "us-east-1",
            "sagemaker_job_name": "homogeneous-1", "sagemaker_container_log_level": "20",
            "sagemaker_submit_directory": "s3://bucket/source.tar.gz"})"));
    roots::writeChannelSecret(rootOf.back());
    runs.push_back(std::make_unique<harness::Run>(
        std::vector<std::string>{HETERO_TRAIN},
        std::vector<std::string>{"TROUPE_SM_ROOT=" + rootOf.back(),
                                 "TROUPE_HOST_MAP=" + (dir / "hosts.json")}));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    INFO(hosts[i] << "\n" << runs[i]->output());
    CHECK(runs[i]->wait(120s) == 0);
    auto out = runs[i]->output();
    CHECK(count(out,
                "head group 'dnn_group' is not in this cluster (groups: homogeneousCluster); "
                "the head is algo-1 instead") == 1);
    CHECK(out.find(i == 0 ? "[algo-1 homogeneousCluster head]"
                          : "[algo-2 homogeneousCluster worker]") != std::string::npos);
    CHECK(std::filesystem::exists(rootOf[i] + "/output/success"));
    CHECK_FALSE(std::filesystem::exists(rootOf[i] + "/output/failure"));
    CHECK_FALSE(harness::processExists(runs[i]->pid()));
  }
  auto head = runs[0]->output();
  // The trainer ran on the head; the epoch table has its one epoch with every sample.
  CHECK(std::regex_search(head, std::regex("trainer +train.Trainer +algo-1 +homogeneousCluster")));
  CHECK(std::regex_search(head, std::regex("\n +1 +2000 +0 +0 +0 ")));
}
