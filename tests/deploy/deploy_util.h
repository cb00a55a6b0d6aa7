// Shared by the deploy process tests: emulated SageMaker clusters started without `troupe sim`.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "harness.h"
#include "roots.h"

namespace deploy {

using nlohmann::json;

inline std::string smApp() {
  return SM_APP;
}
inline std::string trainScript() {
  return TRAIN_SCRIPT;
}

using harness::freePort;

inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A description of two hosts in two groups, as algo-1 (data_group) sees it: a cluster of more than
// one host, so a node needs a job secret.
inline const char* kTwoHosts = R"({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
  "current_group_name": "data_group", "instance_groups": [
    {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1"]},
    {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2"]}]})";

struct NodeResult {
  int code;
  std::string output, failure, root;  // failure: the first line of output/failure
};

// sm_app once from `root` (TROUPE_SM_ROOT, a port of its own, `env`, `args`); it must end by itself
// within 20 s. Writes no secret: the caller puts one where it wants it.
inline NodeResult runNode(const std::string& root, std::vector<std::string> env = {},
                          std::vector<std::string> args = {}) {
  env.push_back("TROUPE_SM_ROOT=" + root);
  // Its own port: tests run in parallel, and a one-host cluster has no host map.
  env.push_back("TROUPE_PORT=" + std::to_string(freePort()));
  args.insert(args.begin(), smApp());
  harness::Run run(args, env);
  NodeResult r;
  r.code = run.wait(std::chrono::seconds(20));
  r.output = run.output();
  r.failure = roots::firstLine(root + "/output/failure");
  r.root = root;
  CHECK_FALSE(harness::processExists(run.pid()));
  return r;
}

// docs/exit-codes.md: a bad setting is exit 2 before anything starts, its message in the log and
// as the failure file's first line ("configuration error on HOST: ..."), and no success file.
inline void expectConfigError(const NodeResult& r, const std::string& message) {
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(message) != std::string::npos);
  CHECK(r.failure.find("configuration error on ") == 0);
  CHECK(r.failure.find(message) != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(r.root + "/output/success"));
}

struct Host {
  std::string name, group, type, root;
};

// A heterogeneous cluster laid out as SageMaker would: one root per instance with its own
// resourceconfig.json (current host and group), host names dealt in a shuffled order across
// groups, plus a host map that puts each name on a loopback port.
struct Cluster {
  roots::TempDir dir;
  std::vector<Host> hosts;
  std::string hostMap;
  std::string secret = roots::kSecret;  // in each root's troupe-secret channel

  Cluster(std::vector<std::pair<std::string, std::string>> groups /* name, type per instance */,
          const std::string& hyperparameters = "{}", unsigned seed = 0) {
    std::mt19937 rng(seed ? seed : std::random_device()());
    std::shuffle(groups.begin(), groups.end(), rng);
    json map = json::object(), all = json::array(), byGroup = json::object();
    std::map<std::string, std::string> typeOf;
    for (size_t i = 0; i < groups.size(); ++i) {
      Host h{"algo-" + std::to_string(i + 1), groups[i].first, groups[i].second, ""};
      map[h.name] = "127.0.0.1:" + std::to_string(freePort());
      all.push_back(h.name);
      byGroup[h.group].push_back(h.name);
      typeOf[h.group] = h.type;
      hosts.push_back(h);
    }
    json instanceGroups = json::array();
    for (auto& [name, members] : byGroup.items()) {
      // Group host lists need not be sorted on SageMaker: reverse them.
      std::vector<std::string> list = members;
      std::reverse(list.begin(), list.end());
      instanceGroups.push_back(
          {{"instance_group_name", name}, {"instance_type", typeOf[name]}, {"hosts", list}});
    }
    for (auto& h : hosts) {
      json rc = {{"current_host", h.name},           {"current_group_name", h.group},
                 {"current_instance_type", h.type},  {"hosts", all},
                 {"network_interface_name", "eth0"}, {"instance_groups", instanceGroups}};
      h.root = roots::makeRoot(dir / h.name, rc.dump(), hyperparameters);
      roots::writeChannelSecret(h.root, secret);
    }
    hostMap = dir / "hosts.json";
    roots::writeFile(hostMap, map.dump());
  }

  // Starts every instance from its root alone (the secret is its troupe-secret channel):
  // TROUPE_SM_ROOT and the host map; no TROUPE_CLUSTER_FILE.
  std::vector<std::unique_ptr<harness::Run>> start(std::vector<std::string> extraEnv = {}) {
    std::vector<std::unique_ptr<harness::Run>> runs;
    for (auto& h : hosts) {
      auto env = extraEnv;
      env.push_back("TROUPE_SM_ROOT=" + h.root);
      env.push_back("TROUPE_HOST_MAP=" + hostMap);
      runs.push_back(std::make_unique<harness::Run>(std::vector<std::string>{smApp()}, env));
    }
    return runs;
  }

  const Host& in(const std::string& group) const {
    for (auto& h : hosts) {
      if (h.group == group) return h;
    }
    throw std::logic_error("no host in " + group);
  }
};

}  // namespace deploy
