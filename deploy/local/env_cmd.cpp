// `troupe env` (env_cmd.h).

#include "env_cmd.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/sagemaker.h"
#include "troupe/torchrun.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sim {

namespace {

// A figure and where it came from, for `troupe env`.
json figureJson(const troupe::Figure& f) {
  return {{"value", f.value}, {"source", f.source}, {"detail", f.detail}};
}

// What this node would report to the head (troupe/node_size.h), each figure with its source.
json nodeJson(const troupe::ClusterConfig* config, const troupe::NodeFlags& flags) {
  troupe::NodeLabels labels;
  troupe::NodeResources resources;
  std::string type;
  if (config != nullptr) {
    auto& group = config->groupOf(config->currentHost);
    labels = group.labels;
    resources = group.resources;
    type = config->currentInstanceType;
  }
  auto d = troupe::describeNode(type, labels, resources, flags, troupe::probeMachine());
  json l = json::object(), r = json::object();
  for (auto& [k, v] : d.labels) l[k] = {{"value", v}, {"source", d.labelSources[k]}};
  for (auto& [k, v] : d.resources) r[k] = {{"value", v}, {"source", d.resourceSources[k]}};
  return {{"instance_type", type},
          {"vcpus", figureJson(d.size.vcpus)},
          {"gpus", figureJson(d.size.gpus)},
          {"memory_bytes", figureJson(d.size.memoryBytes)},
          {"labels", l},
          {"resources", r},
          {"notes", d.size.notes}};
}

json describeConfig(const troupe::ClusterConfig& config) {
  json groups = json::object();
  for (auto& g : config.groups) {
    groups[g.name] = {{"instance_type", g.instanceType}, {"hosts", g.hosts}};
  }
  return {{"description", config.source},
          {"current_host", config.currentHost},
          {"current_group", config.currentGroup},
          {"current_instance_type", config.currentInstanceType},
          {"network_interface", config.networkInterface},
          {"hosts", config.hosts},
          {"groups", groups},
          {"is_heterogeneous", config.groups.size() > 1},
          {"head", config.headHost("")}};
}

}  // namespace

// What a node reads: the cluster description (a SageMaker-shaped root with its hyperparameters and
// channels; else --cluster, a Slurm job's or a pod's environment) and what this node would report.

// torchrun's environment for this host, KEY=VALUE lines (troupe/torchrun.h): MASTER_PORT as the
// environment names it, else torchrun's default; TROUPE_PROCS_PER_HOST as it says.
int printTorchrun(const troupe::ClusterConfig& config, const EnvOptions& o) {
  troupe::TorchrunPorts ports;
  if (const char* port = getenv("MASTER_PORT"); port != nullptr && *port) {
    ports.masterPort = unsigned(std::stoul(port));
  }
  unsigned procs = 0;
  if (const char* given = getenv("TROUPE_PROCS_PER_HOST"); given != nullptr && *given) {
    procs = unsigned(std::stoul(given));
  }
  auto env = troupe::torchrunEnvironment(config, o.headGroup, procs, config.currentHost, ports);
  if (env.variables.empty()) fprintf(stderr, "troupe env: no torchrun environment: %s\n",
                                     env.why.c_str());
  for (auto& [name, value] : env.variables) printf("%s=%s\n", name.c_str(), value.c_str());
  return 0;
}

int runEnv(const EnvOptions& o) {
  try {
    const char* smRoot = getenv("TROUPE_SM_ROOT");
    auto root = o.root.empty() ? troupe::SageMakerEnv::defaultRoot() : o.root;
    bool sageMaker = !o.root.empty() || (smRoot != nullptr && *smRoot != '\0') ||
                     (o.cluster.empty() && fs::exists(root + "/input/config/resourceconfig.json"));
    json out;
    std::optional<troupe::ClusterConfig> config;
    if (sageMaker) {
      auto sm = troupe::SageMakerEnv::load(root);
      config = troupe::ClusterConfig::load(sm.resourceConfigPath());
      out = describeConfig(*config);
      json hps = json::object();
      for (auto& key : sm.keys()) hps[key] = json::parse(sm.getJson(key));
      out["root"] = sm.root();
      out["hyperparameters"] = hps;
      out["channels"] = sm.channels();
    } else {
      auto env = troupe::processEnvironment();
      if (!o.cluster.empty()) {
        config = troupe::ClusterConfig::load(o.cluster);
      } else if (auto slurm = troupe::clusterFromSlurm(env)) {
        config = troupe::ClusterConfig::parse(*slurm, "the Slurm job's environment");
      } else if (auto k8s = troupe::clusterFromK8s(env)) {
        config = troupe::ClusterConfig::parse(*k8s, "the pod's environment");
      }
      out = config ? describeConfig(*config)
                   : json{{"description", "none: a one-node cluster on this machine"}};
    }
    if (o.torchrun) {
      if (!config) {
        fprintf(stderr, "troupe env --torchrun: no cluster description here (a SageMaker root, "
                        "--cluster, a Slurm job or a pod): nothing to set\n");
        return 0;
      }
      return printTorchrun(*config, o);
    }
    out["node"] = nodeJson(config ? &*config : nullptr, o.node);
    printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const troupe::ConfigError& e) {
    fprintf(stderr, "troupe env: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
}

CLI::App* addEnvCommand(CLI::App& cli, EnvOptions& options) {
  auto* envCmd = cli.add_subcommand(
      "env",
      "print, as JSON, what a node sees: its cluster description (from a SageMaker-shaped root: "
      "also hyperparameters, decoded, and channels) and what it reports to the head (vcpus, "
      "gpus, memory, labels, resources), each with where it came from");
  auto& e = options;
  envCmd->add_option("--root", e.root, "the root (default: $TROUPE_SM_ROOT, else /opt/ml)");
  envCmd->add_option("--cluster", e.cluster, "a cluster file, as the app's --cluster")
      ->envname("TROUPE_CLUSTER_FILE");
  envCmd->add_option("--vcpus", e.node.size.vcpus, "as the app's --vcpus")->envname("TROUPE_VCPUS");
  envCmd->add_option("--gpus", e.node.size.gpus, "as the app's --gpus")->envname("TROUPE_GPUS");
  envCmd->add_option("--memory-bytes", e.node.size.memoryBytes, "as the app's --memory-bytes")
      ->envname("TROUPE_MEMORY_BYTES");
  envCmd->add_option("--labels", e.node.labels, "as the app's --labels: KEY=VALUE[,...]")
      ->envname("TROUPE_LABELS");
  envCmd->add_option("--resources", e.node.resources, "as the app's --resources: NAME=AMOUNT[,...]")
      ->envname("TROUPE_RESOURCES");
  envCmd->add_flag("--torchrun", e.torchrun,
                   "print torchrun's environment for this host instead (RANK, WORLD_SIZE, "
                   "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, "
                   "TROUPE_DDP_ROLE), one KEY=VALUE a line, as troupe.data's ranks will be");
  envCmd->add_option("--head-group", e.headGroup, "as the app's --head-group")
      ->envname("TROUPE_HEAD_GROUP");
  return envCmd;
}

}  // namespace sim
