// Bad input under a SageMaker-shaped root: each gives a clear error naming the file, the key and
// the value, the process exits with CONFIG_ERROR (2), and output/failure says the same first.
#include <chrono>

#include "deploy_util.h"

using namespace std::chrono_literals;

namespace {

using deploy::expectConfigError;
using deploy::kTwoHosts;

// The node from `root` with the secret in its troupe-secret channel.
deploy::NodeResult runIn(const std::string& root, std::vector<std::string> env = {}) {
  roots::writeChannelSecret(root);
  return deploy::runNode(root, std::move(env));
}

}  // namespace

TEST_CASE("resourceconfig.json missing, unreadable or not JSON", "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "missing", "");
  auto file = root + "/input/config/resourceconfig.json";
  expectConfigError(runIn(root),
                    "cluster file '" + file + "' cannot be read: No such file or directory");

  root = roots::makeRoot(dir / "dir", "");
  file = root + "/input/config/resourceconfig.json";
  std::filesystem::create_directories(file);
  expectConfigError(runIn(root), "cluster file '" + file + "' cannot be read: it is a directory");

  root = roots::makeRoot(dir / "garbage", "{\"current_host\": \"algo-1\",");
  expectConfigError(runIn(root),
                    "cluster file " + root + "/input/config/resourceconfig.json is not valid JSON");
}

TEST_CASE("resourceconfig.json with wrong types or inconsistent hosts and groups",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  struct Case {
    std::string name, json, message;
  };
  std::vector<Case> cases = {
      {"types", R"({"current_host": "algo-1", "hosts": "algo-1"})",
       "key 'hosts' must be a list of host names, not \"algo-1\""},
      {"type-host", R"({"current_host": 1, "hosts": ["algo-1"]})",
       "key 'current_host' must be a string, not 1"},
      {"absent", R"({"current_host": "algo-9", "hosts": ["algo-1", "algo-2"]})",
       "current_host 'algo-9' is not in 'hosts' (2 hosts)"},
      {"empty-group", R"({"current_host": "algo-1", "hosts": ["algo-1"], "instance_groups": [
          {"instance_group_name": "data_group", "hosts": ["algo-1"]},
          {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": []}]})",
       "instance group 'dnn_group' has no hosts; give it at least one or remove it"},
      {"two-groups",
       R"({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "instance_groups": [
          {"instance_group_name": "data_group", "hosts": ["algo-1", "algo-2"]},
          {"instance_group_name": "dnn_group", "hosts": ["algo-1"]}]})",
       "host 'algo-1' is in two groups, 'data_group' and 'dnn_group'; a host belongs to one group"},
  };
  for (auto& c : cases) {
    SECTION(c.name) {
      auto root = roots::makeRoot(dir / c.name, c.json);
      expectConfigError(runIn(root),
                        "cluster file " + root + "/input/config/resourceconfig.json: " + c.message);
    }
  }
}

TEST_CASE("hyperparameters.json that does not parse, or a value of the wrong type",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "hp", kTwoHosts, R"({"epochs": "3",)");
  expectConfigError(runIn(root), "hyperparameters file " + root +
                                     "/input/config/hyperparameters.json is not valid JSON");
  root = roots::makeRoot(dir / "hp-list", kTwoHosts, R"(["epochs", "3"])");
  expectConfigError(runIn(root), "hyperparameters file " + root +
                                     "/input/config/hyperparameters.json must hold a JSON object");

  // A value the app reads as an integer: the job fails (1) with the key and the value.
  root = roots::makeRoot(dir / "hp-type", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                         R"({"epochs": "three"})");
  auto r = runIn(root);
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.failure.find("hyperparameter 'epochs' in " + root +
                       "/input/config/hyperparameters.json is \"three\" (a string), not an "
                       "integer") != std::string::npos);
}

TEST_CASE("an unknown instance type runs, with a warning and this machine's size",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "x", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "data_group", "current_instance_type": "ml.x9.mega"})");
  auto r = runIn(root);
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("instance type 'ml.x9.mega' is not in troupe's table; using this "
                      "machine's size") != std::string::npos);
  CHECK(r.output.find("NODE algo-1 group=data_group type=ml.x9.mega") != std::string::npos);
  CHECK(std::filesystem::exists(root + "/output/success"));
}

TEST_CASE("without TROUPE_SM_ROOT an explicit cluster file writes no outcome file",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "plain", R"({"hosts": ["algo-1"]})");
  harness::Run run({deploy::smApp()},
                   {"TROUPE_CLUSTER_FILE=" + root + "/input/config/resourceconfig.json"});
  CHECK(run.wait(10s) == 2);
  CHECK(run.output().find("key 'current_host' is missing") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(root + "/output/failure"));
}
