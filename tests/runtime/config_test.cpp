// The cluster description: SageMaker's resourceconfig.json shape, and the errors for bad ones.
#include <catch2/catch.hpp>

#include "config_error.h"
#include "troupe/config.h"

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
