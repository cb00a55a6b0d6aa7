// Cluster descriptions from recorded environments: Slurm heterogeneous and plain jobs, Kubernetes
// pods; Slurm's host list syntax; CPU lists; interface addresses.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "config_error.h"
#include "troupe/config.h"

using nlohmann::json;
using troupe::ClusterConfig;
using troupe::ConfigError;
using troupe::Environment;

namespace {

using Hosts = std::vector<std::string>;

const auto errorOf = troupe::testing::configErrorOf;

// Recorded from `srun --het-group=0,1 env` inside `sbatch` with two hetjob components
// (Slurm 22.05), trimmed to what the adapter reads plus some it must ignore.
Environment slurmHet(const std::string& node) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_HET_SIZE", "2"},
          {"SLURM_JOB_NODELIST", "cpu[01-02],gpu07"},
          {"SLURM_JOB_NODELIST_HET_GROUP_0", "cpu[01-02]"},
          {"SLURM_JOB_NODELIST_HET_GROUP_1", "gpu07"},
          {"SLURM_JOB_CPUS_PER_NODE_HET_GROUP_0", "72(x2)"},
          {"SLURM_NODELIST", "cpu[01-02],gpu07"},
          {"SLURMD_NODENAME", node},
          {"TROUPE_SLURM_GROUPS", "data_group:ml.c5.18xlarge,dnn_group:ml.p4d.24xlarge"}};
}

}  // namespace

TEST_CASE("Slurm host lists expand like `scontrol show hostnames`", "[slurm]") {
  auto x = [](const std::string& s) { return troupe::expandHostList(s, "V"); };
  CHECK(x("node[01-03,07]") == Hosts{"node01", "node02", "node03", "node07"});
  CHECK(x("gpu1,cpu[8-10]") == Hosts{"gpu1", "cpu8", "cpu9", "cpu10"});
  CHECK(x("r[1-2]n[1-2]") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(x("a[009-011]-ib") == Hosts{"a009-ib", "a010-ib", "a011-ib"});
  CHECK(x("single") == Hosts{"single"});
  CHECK(errorOf([&] { x("node[01-03"); }) ==
        "V 'node[01-03' is not a Slurm host list: unbalanced brackets");
  CHECK(errorOf([&] { x("node[5-3]"); }) ==
        "V 'node[5-3]' is not a Slurm host list: range '5-3' runs backwards");
  CHECK(errorOf([&] { x("node[a-b]"); }) ==
        "V 'node[a-b]' is not a Slurm host list: 'a-b' is not a number or range");
  CHECK(errorOf([&] { x("a,,b"); }) == "V 'a,,b' is not a Slurm host list: an empty host name");
}

TEST_CASE("a Slurm heterogeneous job: one instance group per hetjob component", "[slurm]") {
  auto text = troupe::clusterFromSlurm(slurmHet("cpu02"));
  REQUIRE(text);
  auto c = ClusterConfig::parse(*text, "slurm");
  CHECK(c.currentHost == "cpu02");
  CHECK(c.currentGroup == "data_group");
  CHECK(c.currentInstanceType == "ml.c5.18xlarge");
  CHECK(c.hosts == Hosts{"cpu01", "cpu02", "gpu07"});
  REQUIRE(c.groups.size() == 2);
  CHECK(c.groups[0].hosts == Hosts{"cpu01", "cpu02"});
  CHECK(c.groups[1].name == "dnn_group");
  CHECK(c.groups[1].hosts == Hosts{"gpu07"});
  CHECK(c.headHost("") == "gpu07");  // the GPU group's first host

  auto gpu = ClusterConfig::parse(*troupe::clusterFromSlurm(slurmHet("gpu07")), "slurm");
  CHECK(gpu.currentGroup == "dnn_group");
}

TEST_CASE("Slurm: default group names, old PACK variables, plain jobs, not Slurm", "[slurm]") {
  auto env = slurmHet("gpu07");
  env.erase("TROUPE_SLURM_GROUPS");
  auto c = ClusterConfig::parse(*troupe::clusterFromSlurm(env), "slurm");
  CHECK(c.groupNames() == "het_group_0, het_group_1");
  CHECK(c.currentGroup == "het_group_1");

  Environment pack = {{"SLURM_PACK_SIZE", "2"},
                      {"SLURM_JOB_NODELIST_PACK_GROUP_0", "c1"},
                      {"SLURM_JOB_NODELIST_PACK_GROUP_1", "g1"},
                      {"SLURMD_NODENAME", "c1"}};
  CHECK(ClusterConfig::parse(*troupe::clusterFromSlurm(pack), "slurm").hosts == Hosts{"c1", "g1"});

  Environment plain = {{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURMD_NODENAME", "n2"}};
  auto p = ClusterConfig::parse(*troupe::clusterFromSlurm(plain), "slurm");
  CHECK(p.groupNames() == "slurm");
  CHECK(p.hosts == Hosts{"n1", "n2", "n3"});

  CHECK_FALSE(troupe::clusterFromSlurm({{"SLURM_JOB_NODELIST", "n1"}}));  // no SLURMD_NODENAME
  CHECK_FALSE(troupe::clusterFromSlurm({{"HOME", "/root"}}));
}

TEST_CASE("Slurm: bad environments name the variable and its value", "[slurm][bad-input]") {
  auto env = slurmHet("cpu01");
  env.erase("SLURM_JOB_NODELIST_HET_GROUP_1");
  CHECK(errorOf([&] { troupe::clusterFromSlurm(env); }) ==
        "SLURM_HET_SIZE is 2 but SLURM_JOB_NODELIST_HET_GROUP_1 is not set; run the app through "
        "srun in the job's every component (srun --het-group=0-1)");
  env = slurmHet("cpu01");
  env["TROUPE_SLURM_GROUPS"] = "data_group";
  CHECK(errorOf([&] { troupe::clusterFromSlurm(env); }) ==
        "TROUPE_SLURM_GROUPS 'data_group' names 1 groups but the job has 2 component(s); name one "
        "per component");
  env = slurmHet("cpu01");
  env["SLURM_HET_SIZE"] = "two";
  CHECK(errorOf([&] { troupe::clusterFromSlurm(env); }) ==
        "SLURM_HET_SIZE 'two' must be a number of components (1-64)");
  env = slurmHet("login1");  // not one of the job's nodes
  CHECK(errorOf([&] { ClusterConfig::parse(*troupe::clusterFromSlurm(env), "slurm env"); }) ==
        "cluster file slurm env: current_host 'login1' is not in 'hosts' (3 hosts)");
  env = slurmHet("cpu01");
  env["SLURM_JOB_NODELIST_HET_GROUP_1"] = "cpu01";  // a node in two components
  CHECK_THAT(errorOf([&] { ClusterConfig::parse(*troupe::clusterFromSlurm(env), "slurm env"); }),
             Catch::Contains("host 'cpu01' is in two groups, 'data_group' and 'dnn_group'"));
}

TEST_CASE("Kubernetes: groups from TROUPE_K8S_GROUPS, this pod from HOSTNAME", "[k8s]") {
  // Recorded in a pod of the StatefulSet data-group (deploy/k8s/troupe.yaml), trimmed.
  Environment env = {{"HOSTNAME", "data-group-1"},
                     {"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                     {"TROUPE_K8S_GROUPS", "data_group=2:ml.c5.18xlarge,dnn_group=1:ml.p3.2xlarge"},
                     {"TROUPE_K8S_SERVICE", "troupe"}};
  auto text = troupe::clusterFromK8s(env);
  REQUIRE(text);
  CHECK(json::parse(*text)["network_interface_name"] == "eth0");
  auto c = ClusterConfig::parse(*text, "k8s");
  CHECK(c.currentHost == "data-group-1.troupe");
  CHECK(c.currentGroup == "data_group");
  CHECK(c.hosts == Hosts{"data-group-0.troupe", "data-group-1.troupe", "dnn-group-0.troupe"});
  CHECK(c.headHost("") == "dnn-group-0.troupe");

  env["TROUPE_POD_NAME"] = "dnn-group-0";  // the downward API wins over HOSTNAME
  CHECK(ClusterConfig::parse(*troupe::clusterFromK8s(env), "k8s").currentGroup == "dnn_group");

  env["TROUPE_POD_NAME"] = "dnn-group-3";
  CHECK(errorOf([&] { troupe::clusterFromK8s(env); }) ==
        "pod 'dnn-group-3' is none of the pods TROUPE_K8S_GROUPS 'data_group=2:ml.c5.18xlarge,"
        "dnn_group=1:ml.p3.2xlarge' describes (data-group-0..1, dnn-group-0..0); check the "
        "StatefulSet/Job names and replica counts");
  env["TROUPE_K8S_GROUPS"] = "data_group,dnn_group=1";
  CHECK(errorOf([&] { troupe::clusterFromK8s(env); }) ==
        "TROUPE_K8S_GROUPS 'data_group,dnn_group=1': entry 'data_group' needs a size from 1 up: "
        "NAME=COUNT[:TYPE]");
  CHECK_FALSE(troupe::clusterFromK8s({{"HOSTNAME", "x"}}));
}

TEST_CASE("CPU lists and interface addresses", "[pin]") {
  CHECK(troupe::parseCpuList("0-3,7", "X") == std::vector<unsigned>{0, 1, 2, 3, 7});
  CHECK(troupe::formatCpuList({0, 1, 2, 3, 7, 9, 10}) == "0-3,7,9-10");
  CHECK(errorOf([] { troupe::parseCpuList("1-a", "TROUPE_CPUS"); }) ==
        "TROUPE_CPUS '1-a' is not a CPU list like \"0-3,7\"");
  CHECK(errorOf([] { troupe::parseCpuList("", "X"); }) == "X '' is not a CPU list like \"0-3,7\"");
  CHECK(troupe::interfaceAddress("lo") == std::optional<std::string>("127.0.0.1"));
  CHECK_FALSE(troupe::interfaceAddress("nosuch0"));
}
