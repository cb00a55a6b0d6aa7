// The cluster description: SageMaker's resourceconfig.json shape, and the errors for bad ones.
#include <catch2/catch.hpp>

#include "config_error.h"
#include "troupe/config.h"
#include "troupe/torchrun.h"

using troupe::ClusterConfig;
using troupe::ConfigError;

namespace {

const char* kHetero = R"({
  "current_host": "algo-1", "current_group_name": "data_group",
  "current_instance_type": "ml.c5.xlarge", "hosts": ["algo-2", "algo-1", "algo-3"],
  "network_interface_name": "eth0",
  "instance_groups": [
    {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2"]},
    {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge",
     "hosts": ["algo-3", "algo-1"]}]})";

}  // namespace

TEST_CASE("a heterogeneous description parses, hosts and groups come out sorted", "[config]") {
  auto c = ClusterConfig::parse(kHetero, "rc.json");
  CHECK(c.currentHost == "algo-1");
  CHECK(c.currentGroup == "data_group");
  CHECK(c.hosts == std::vector<std::string>{"algo-1", "algo-2", "algo-3"});
  REQUIRE(c.groups.size() == 2);
  CHECK(c.groups[0].name == "data_group");
  CHECK(c.groups[0].hosts == std::vector<std::string>{"algo-1", "algo-3"});
  CHECK(c.groupOf("algo-2").name == "dnn_group");
}

TEST_CASE("the head is the first host of the head group, by default the GPU group", "[config]") {
  auto c = ClusterConfig::parse(kHetero, "rc.json");
  CHECK(c.headHost("") == "algo-2");  // ml.p3.2xlarge has a GPU
  CHECK(c.headHost("data_group") == "algo-1");
  CHECK_THROWS_WITH(c.headHost("dnn_grup"),
                    "head group 'dnn_grup' is unknown; groups are: data_group, dnn_group");
}

TEST_CASE("a homogeneous description has one group holding every host", "[config]") {
  auto c = ClusterConfig::parse(
      R"({"current_host":"algo-2","hosts":["algo-1","algo-2"],"current_group_name":"homogeneousCluster",
          "current_instance_type":"ml.c5.xlarge"})",
      "rc.json");
  REQUIRE(c.groups.size() == 1);
  CHECK(c.groups[0].name == "homogeneousCluster");
  CHECK(c.headHost("") == "algo-1");  // no GPU group: the first host
}

TEST_CASE("a head group the cluster lacks falls back to the default head, with one warning",
          "[config]") {
  // SageMaker's homogeneous job: no instance_groups, one group named "homogeneousCluster".
  auto homogeneous = ClusterConfig::parse(
      R"({"current_host":"algo-2","hosts":["algo-2","algo-1"],"current_group_name":"homogeneousCluster",
          "current_instance_type":"ml.c5.xlarge"})",
      "rc.json");
  auto warning = homogeneous.missingHeadGroup("dnn_group");
  REQUIRE(warning);
  CHECK(*warning ==
        "head group 'dnn_group' is not in this cluster (groups: homogeneousCluster); the head is "
        "algo-1 instead, the first host of the cluster (no group has GPUs)");
  CHECK(homogeneous.headHost("") == "algo-1");

  // A homogeneous GPU cluster: the default head is in the GPU group.
  auto gpus = ClusterConfig::parse(
      R"({"current_host":"algo-1","hosts":["algo-1","algo-2"],"current_group_name":"homogeneousCluster",
          "current_instance_type":"ml.p3.2xlarge"})",
      "rc.json");
  REQUIRE(gpus.missingHeadGroup("dnn_group"));
  CHECK(
      gpus.missingHeadGroup("dnn_group")
          ->find("the head is algo-1 instead, the first host of group 'homogeneousCluster', whose "
                 "ml.p3.2xlarge has GPUs") != std::string::npos);

  // A group that exists, or none asked for: nothing to warn about.
  auto hetero = ClusterConfig::parse(kHetero, "rc.json");
  CHECK_FALSE(hetero.missingHeadGroup("dnn_group"));
  CHECK_FALSE(hetero.missingHeadGroup(""));
  CHECK_FALSE(homogeneous.missingHeadGroup("homogeneousCluster"));
  CHECK(hetero.missingHeadGroup("gpu_group")
            ->find("(groups: data_group, dnn_group); the head is "
                   "algo-2 instead") != std::string::npos);
}

TEST_CASE("bad descriptions name the file, the key and the value", "[config][bad-input]") {
  auto fails = [](const char* json) {
    return troupe::testing::configErrorOf([&] { ClusterConfig::parse(json, "rc.json"); });
  };
  CHECK(fails("{not json").find("cluster file rc.json is not valid JSON") == 0);
  CHECK(fails("[]") == "cluster file rc.json must hold a JSON object");
  CHECK(fails(R"({"hosts":["a"]})") == "cluster file rc.json: key 'current_host' is missing");
  CHECK(fails(R"({"current_host":1,"hosts":["a"]})") ==
        "cluster file rc.json: key 'current_host' must be a string, not 1");
  CHECK(fails(R"({"current_host":"b","hosts":["a"]})") ==
        "cluster file rc.json: current_host 'b' is not in 'hosts' (1 hosts)");
  CHECK(fails(R"({"current_host":"a","hosts":["a","a"]})") ==
        "cluster file rc.json: host 'a' appears twice in 'hosts'; list each host once");
  CHECK(fails(R"({"current_host":"a","hosts":["a","b"],"instance_groups":[
                 {"instance_group_name":"g","hosts":["a"]}]})") ==
        "cluster file rc.json: host 'b' is in no instance group; add it to one of: g");
  CHECK(
      fails(R"({"current_host":"a","hosts":["a"],"instance_groups":[
                 {"instance_group_name":"g","hosts":["a"]},{"instance_group_name":"h","hosts":["a"]}]})") ==
      "cluster file rc.json: host 'a' is in two groups, 'g' and 'h'; a host belongs to one group");
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"instance_groups":[
                 {"instance_group_name":"g","hosts":["a"]},{"instance_group_name":"h","hosts":[]}]})") ==
        "cluster file rc.json: instance group 'h' has no hosts; give it at least one or remove it");
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"current_group_name":"x","instance_groups":[
                 {"instance_group_name":"g","hosts":["a"]}]})") ==
        "cluster file rc.json: current_group_name 'x' does not match the group of current_host 'a' "
        "('g')");
}

TEST_CASE("a missing file is a clear error", "[config][bad-input]") {
  CHECK_THROWS_WITH(ClusterConfig::load("/nonexistent/rc.json"),
                    Catch::StartsWith("cluster file '/nonexistent/rc.json' cannot be read"));
}

TEST_CASE("labels and resources: the top level for every host, a group's over it per key",
          "[config][labels]") {
  auto c = ClusterConfig::parse(R"({"current_host": "a", "hosts": ["a", "b"],
      "labels": {"zone": "a", "disk": "ssd"}, "resources": {"licence": 1},
      "instance_groups": [
        {"instance_group_name": "g", "hosts": ["a"], "labels": {"disk": "nvme"},
         "resources": {"fpga": 2}},
        {"instance_group_name": "h", "hosts": ["b"]}]})",
                                "rc.json");
  CHECK(c.groupOf("a").labels == troupe::NodeLabels{{"disk", "nvme"}, {"zone", "a"}});
  CHECK(c.groupOf("a").resources == troupe::NodeResources{{"fpga", 2.0}, {"licence", 1.0}});
  CHECK(c.groupOf("b").labels == troupe::NodeLabels{{"disk", "ssd"}, {"zone", "a"}});
  CHECK(c.groupOf("b").resources == troupe::NodeResources{{"licence", 1.0}});
  auto homogeneous = ClusterConfig::parse(
      R"({"current_host": "a", "hosts": ["a"], "labels": {"zone": "b"}})", "rc.json");
  CHECK(homogeneous.groupOf("a").labels == troupe::NodeLabels{{"zone", "b"}});
}

TEST_CASE("bad labels and resources in a cluster file name the file, the key and the value",
          "[config][labels][bad-input]") {
  auto fails = [](const std::string& text) {
    return troupe::testing::configErrorOf([&] { ClusterConfig::parse(text, "rc.json"); });
  };
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"labels":["zone=a"]})") ==
        "cluster file rc.json: 'labels' must be an object of strings, e.g. {\"zone\": \"a\"}, not "
        "[\"zone=a\"]");
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"labels":{"zone":1}})") ==
        "cluster file rc.json: 'labels': the value of 'zone' must be a string, not 1");
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"instance_groups":[
                 {"instance_group_name":"g","hosts":["a"],"resources":{"fpga":"x"}}]})") ==
        "cluster file rc.json: 'resources' of instance group 'g': the amount of 'fpga' must be a "
        "number, not \"x\"");
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"resources":{"fpga":-1}})")
            .find("cluster file rc.json: 'resources' 'fpga=-1': '-1' is not an amount for "
                  "'fpga'") == 0);
  CHECK(fails(R"({"current_host":"a","hosts":["a"],"labels":{"host":"x"}})")
            .find("label 'host' is set by troupe itself") != std::string::npos);
}

namespace {

// The value of `name` among `env`'s variables, or "" without it.
std::string valueOf(const troupe::TorchrunEnvironment& env, const std::string& name) {
  for (auto& [k, v] : env.variables) {
    if (k == name) return v;
  }
  return "";
}

const char* kTwoRanks = R"({
  "current_host": "algo-1", "current_group_name": "data_group",
  "current_instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"],
  "network_interface_name": "eth0",
  "instance_groups": [
    {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge",
     "hosts": ["algo-4", "algo-2"]},
    {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge",
     "hosts": ["algo-3", "algo-1"]}]})";

}  // namespace

TEST_CASE("torchrun's environment from the description: the training group's hosts are the ranks, "
          "a data instance a world of one, several processes a host none",
          "[config][torchrun]") {
  auto c = ClusterConfig::parse(kTwoRanks, "rc.json");
  troupe::TorchrunPorts ports{"10.0.0.2", 41000, 42000};
  // The head is algo-2 (the GPU group's first host): rank 0; algo-4 rank 1.
  auto head = troupe::torchrunEnvironment(c, "", 0, "algo-2", ports);
  CHECK(valueOf(head, "RANK") == "0");
  CHECK(valueOf(head, "WORLD_SIZE") == "2");
  CHECK(valueOf(head, "LOCAL_RANK") == "0");
  CHECK(valueOf(head, "LOCAL_WORLD_SIZE") == "1");
  CHECK(valueOf(head, "MASTER_ADDR") == "10.0.0.2");
  CHECK(valueOf(head, "MASTER_PORT") == "41000");
  CHECK(valueOf(head, "TROUPE_DDP_ROLE") == "rank");
  CHECK(valueOf(head, "GLOO_SOCKET_IFNAME") == "eth0");  // the description's interface
  auto other = troupe::torchrunEnvironment(c, "dnn_group", 0, "algo-4", ports);
  CHECK(valueOf(other, "RANK") == "1");
  CHECK(valueOf(other, "GROUP_RANK") == "1");
  // A data instance: rank 0 of a world of one on itself, its own port.
  auto data = troupe::torchrunEnvironment(c, "", 0, "algo-3", ports);
  CHECK(valueOf(data, "RANK") == "0");
  CHECK(valueOf(data, "WORLD_SIZE") == "1");
  CHECK(valueOf(data, "MASTER_ADDR") == "127.0.0.1");
  CHECK(valueOf(data, "MASTER_PORT") == "42000");
  CHECK(valueOf(data, "TROUPE_DDP_ROLE") == "data");
  // Without an address the head's host name; a group the cluster lacks falls back to the default.
  auto named = troupe::torchrunEnvironment(c, "gpu_group", 0, "algo-4", troupe::TorchrunPorts{});
  CHECK(valueOf(named, "MASTER_ADDR") == "algo-2");
  CHECK(valueOf(named, "MASTER_PORT") == "29500");
  // Two processes an instance: the DataLoader starts the second, after the script's first line.
  auto two = troupe::torchrunEnvironment(c, "", 2, "algo-2", ports);
  CHECK(two.variables.empty());
  CHECK_THAT(two.why, Catch::Matchers::Contains("2 processes each"));
}
