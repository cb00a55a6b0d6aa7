// `troupe sim`'s instances laid out (sim_instances.h).

#include "sim_instances.h"


#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <kj/debug.h>
#include <kj/io.h>

#include "job_file.h"
#include "sim_lines.h"
#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/sched/instance_types.h"
#include "troupe/torchrun.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sim {

namespace {

// `count` loopback ports, all different. Each socket stays bound until every port is chosen: a
// port bound and closed at once can be handed out again by the next bind (seen with 256
// instances: two of them given one port). The ports are free again when this returns; an instance
// that then finds its port taken by another program fails to listen, naming it.
std::vector<unsigned> freePorts(size_t count) {
  std::vector<kj::AutoCloseFd> held;
  std::vector<unsigned> ports;
  for (size_t i = 0; i < count; ++i) {
    int fd;
    KJ_SYSCALL(fd = socket(AF_INET, SOCK_STREAM, 0));
    held.emplace_back(fd);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    KJ_SYSCALL(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
               "cannot reserve a loopback port for an instance", i);
    socklen_t len = sizeof(addr);
    KJ_SYSCALL(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len));
    ports.push_back(ntohs(addr.sin_port));
  }
  return ports;
}

}  // namespace

int codeOf(const troupe::ChildExit& e) {
  return e.signal ? 128 + e.signal : static_cast<int>(e.status);
}

int Instance::finalCode() const {
  std::vector<int> codes;
  for (auto& e : ended) codes.push_back(codeOf(e.exit));
  return sim::finalCode(codes);
}

std::string formatCpus(double cpus) {
  char text[32];
  snprintf(text, sizeof(text), "%g", cpus);
  return text;
}

// --pin: the CPUs each instance runs on. --cpus HOST_OR_GROUP=LIST names them; the others share
// this machine's CPUs in proportion to their instance type's vCPUs (at least one each), or one
// each in turn when there are more instances than CPUs.
void assignCpus(std::vector<Instance>& instances, const std::vector<std::string>& cpuArgs,
                bool pin) {
  std::map<std::string, std::string> fixed;
  for (auto& a : cpuArgs) {
    auto [who, list] = splitPair(a, '=', "--cpus", "HOST_OR_GROUP=CPU_LIST");
    troupe::parseCpuList(list, "--cpus " + who);  // checks it
    fixed[who] = list;
  }
  cpu_set_t set;
  std::vector<unsigned> mine;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) mine.push_back(c);
    }
  }
  std::vector<Instance*> rest;
  for (auto& in : instances) {
    if (fixed.count(in.host)) {
      in.cpus = fixed[in.host];
    } else if (fixed.count(in.group)) {
      in.cpus = fixed[in.group];
    } else if (pin) {
      rest.push_back(&in);
    }
  }
  if (rest.empty() || mine.empty()) return;
  if (rest.size() > mine.size()) {
    for (size_t i = 0; i < rest.size(); ++i) rest[i]->cpus = std::to_string(mine[i % mine.size()]);
    printf("troupe sim: --pin: %zu instances on %zu CPUs; some share a CPU\n", rest.size(),
           mine.size());
    return;
  }
  std::vector<double> weight;
  double total = 0;
  for (auto* in : rest) {
    auto type = troupe::sched::findInstanceType(in->instanceType);
    weight.push_back(type ? type->vcpus : 1);
    total += weight.back();
  }
  std::vector<size_t> count;
  size_t used = 0;
  for (auto w : weight) {
    count.push_back(std::max<size_t>(1, static_cast<size_t>(mine.size() * w / total)));
    used += count.back();
  }
  while (used < mine.size()) {  // the spare CPUs go where they are shortest
    size_t best = 0;
    for (size_t i = 1; i < rest.size(); ++i) {
      if (weight[i] / count[i] > weight[best] / count[best]) best = i;
    }
    ++count[best];
    ++used;
  }
  size_t next = 0;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::vector<unsigned> cpus(mine.begin() + next, mine.begin() + next + count[i]);
    next += count[i];
    rest[i]->cpus = troupe::formatCpuList(cpus);
  }
}

// One instance's root, as SageMaker lays it out: resourceconfig.json, hyperparameters.json,
// inputdataconfig.json, input/data/<channel> links, model/, output/, and checkpoints/ (a link to
// the job's checkpoint folder) when the job has one.
void writeRoot(const Instance& in, const JobSpec& spec, const json& allHosts,
               const json& instanceGroups, bool netns) {
  fs::path root = in.root;
  fs::create_directories(root / "input" / "config");
  fs::create_directories(root / "model");
  fs::create_directories(root / "output" / "data");
  fs::create_directories(root / "input" / "data");
  json rc = {{"current_host", in.host},
             {"current_group_name", in.group},
             {"current_instance_type", in.instanceType},
             {"hosts", allHosts},
             {"network_interface_name", netns ? "eth0" : "lo"},
             {"instance_groups", instanceGroups}};
  std::ofstream(root / "input" / "config" / "resourceconfig.json") << rc.dump(2) << "\n";
  std::ofstream(root / "input" / "config" / "hyperparameters.json")
      << spec.hyperparameters.dump(2) << "\n";
  json dataConfig = json::object();
  for (auto& [name, path] : spec.channels) {
    fs::create_symlink(path, root / "input" / "data" / name);
    dataConfig[name] = {{"TrainingInputMode", "File"},
                        {"S3DistributionType", "FullyReplicated"},
                        {"RecordWrapperType", "None"}};
  }
  std::ofstream(root / "input" / "config" / "inputdataconfig.json") << dataConfig.dump(2) << "\n";
  // SageMaker syncs checkpoint_s3_uri into every instance's /opt/ml/checkpoints before the job
  // starts, and uploads what is written there: one folder that outlives the run does the same.
  if (!spec.checkpoints.empty())
    fs::create_directory_symlink(spec.checkpoints, root / "checkpoints");
}

// An instance's environment: this process's, but troupe's own variables, plus the root, the host
// map, the CPU set, the secret's path and the --env variables for it.
std::vector<std::string> environment(const Instance& in, const JobSpec& spec,
                                     const fs::path& hostMap, bool netns) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "TROUPE_", 7) != 0) env.push_back(*e);
  }
  // The root alone, as on SageMaker: the node finds resourceconfig.json in it.
  env.push_back("TROUPE_SM_ROOT=" + in.root);
  // The same root for SageMaker's own sagemaker-training toolkit (its `train` as the instance's
  // entry, as in AWS's framework images): it reads SAGEMAKER_BASE_DIR, else /opt/ml, and off
  // SageMaker makes a root of its own under ~/sagemaker_local.
  std::erase_if(env, [](const std::string& e) { return e.starts_with("SAGEMAKER_BASE_DIR="); });
  env.push_back("SAGEMAKER_BASE_DIR=" + in.root);
  if (!netns) env.push_back("TROUPE_HOST_MAP=" + hostMap.string());
  if (!in.cpus.empty()) env.push_back("TROUPE_CPUS=" + in.cpus);
  if (in.cpuScale > 0) env.push_back("TROUPE_CPU_SCALE=" + formatCpus(in.cpuScale));
  if (in.controlPort != 0) env.push_back("TROUPE_CONTROL_PORT=" + std::to_string(in.controlPort));
  // The instance type's size, explicitly: a node otherwise reports what this machine allows
  // (troupe/node_size.h), and one small machine emulates the whole cluster.
  if (auto type = troupe::sched::findInstanceType(in.instanceType)) {
    env.push_back("TROUPE_VCPUS=" + std::to_string(type->vcpus));
    env.push_back("TROUPE_GPUS=" + std::to_string(type->gpus));
    env.push_back("TROUPE_MEMORY_BYTES=" +
                  std::to_string(static_cast<uint64_t>(type->memoryGib * (1ull << 30))));
    // A CPU instance type has no GPU: its processes see none of this machine's, as on the cloud
    // (a data instance's augmenters never take the dnn instance's GPU). A GPU type sees what this
    // process sees; --env may set CUDA_VISIBLE_DEVICES for either.
    if (type->gpus == 0) {
      std::erase_if(env,
                    [](const std::string& v) { return v.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0; });
      env.push_back("CUDA_VISIBLE_DEVICES=");
    }
  }
  // The secret's path, never the secret: a process's environment is readable in /proc.
  env.push_back("TROUPE_TOKEN_FILE=" + spec.tokenFile);
  env.push_back("TROUPE_ROLE_FILE=" + in.root + "/role");
  env.push_back("TROUPE_DIE_WITH_PARENT=" + std::to_string(getpid()));
  if (!spec.headGroup.empty()) env.push_back("TROUPE_HEAD_GROUP=" + spec.headGroup);
  if (!spec.traceFile.empty()) env.push_back("TROUPE_TRACE=" + spec.traceFile.string());
  for (auto& kv : in.torchrun) {
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& v) { return v.rfind(key, 0) == 0; });
    env.push_back(kv);
  }
  for (auto& e : spec.envArgs) {
    auto colon = e.find(':');
    auto who = e.substr(0, colon);
    if (who != in.host && who != in.group) continue;
    // Replace a variable set above rather than add a second one (getenv finds the first).
    auto kv = e.substr(colon + 1);
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& v) { return v.rfind(key, 0) == 0; });
    // A secret of its own (a wrong-secret test) replaces the job's, in either form.
    if (key == "TROUPE_TOKEN=" || key == "TROUPE_TOKEN_FILE=") {
      std::erase_if(env, [](const std::string& v) {
        return v.rfind("TROUPE_TOKEN=", 0) == 0 || v.rfind("TROUPE_TOKEN_FILE=", 0) == 0;
      });
    }
    env.push_back(kv);
  }
  return env;
}

// torchrun's environment for each of the job's instances (troupe/torchrun.h), from the cluster
// description its roots hold: a script that calls init_process_group() on its first lines meets
// the other ranks there. On loopback rank 0's store and each data instance's world of one get
// ports of their own (MASTER_PORT from this process's environment wins for rank 0's); with
// --netns every instance has its own ports, torchrun's default.
void setTorchrun(std::vector<Instance>& instances, const JobSpec& spec,
                 const std::function<unsigned(size_t)>& port, unsigned masterPort) {
  if (instances.empty()) return;
  auto config = troupe::ClusterConfig::load(instances.front().root +
                                            "/input/config/resourceconfig.json");
  unsigned procs = 0;
  for (auto& e : spec.envArgs) {
    auto at = e.find(":TROUPE_PROCS_PER_HOST=");
    if (at != std::string::npos) procs = unsigned(std::stoul(e.substr(at + 23)));
  }
  troupe::TorchrunPorts p;
  auto group = config.missingHeadGroup(spec.headGroup) ? std::string() : spec.headGroup;
  auto head = config.headHost(group);
  for (auto& in : instances) {
    if (in.host == head) p.masterAddr = in.address.substr(0, in.address.rfind(':'));
  }
  const char* given = getenv("MASTER_PORT");
  p.masterPort = given != nullptr && *given ? unsigned(std::stoul(given)) : masterPort;
  for (size_t i = 0; i < instances.size(); ++i) {
    p.alonePort = port(i);
    auto env = troupe::torchrunEnvironment(config, group, procs, instances[i].host, p);
    for (auto& [name, value] : env.variables) instances[i].torchrun.push_back(name + "=" + value);
  }
}

// Run `dir`'s instances: host names dealt in a shuffled order across groups, like SageMaker's
// algo-N (a run started again is dealt afresh, as new capacity is), an address each (a loopback
// port, or with --netns the instance's own), CPU sets, the host map and every root.
std::vector<Instance> layOut(const JobSpec& spec, std::mt19937& rng, const fs::path& dir,
                             std::optional<NetnsLab>& lab) {
  std::vector<std::pair<std::string, std::string>> slots;  // group, type
  for (auto& g : spec.groups) {
    for (unsigned i = 0; i < g.count; ++i) slots.emplace_back(g.name, g.instanceType);
  }
  std::shuffle(slots.begin(), slots.end(), rng);

  std::vector<Instance> instances;
  size_t extras = 0;
  for (auto& u : spec.scaleUps) extras += u.count;
  // On loopback, two ports each: its node's, and its control path's should it be the head. A
  // head's control listener on any free port could take a port reserved here for an instance
  // that has not bound it yet (seen: "Address already in use" for a worker's own port).
  // And one for each instance's torchrun store (setTorchrun), and rank 0's.
  auto ports = lab ? std::vector<unsigned>()
                   : freePorts(2 * (slots.size() + extras) + slots.size() + extras + 1);
  auto torchrunPort = [&](size_t i) {
    return lab ? 29500u : ports[2 * (slots.size() + extras) + i];  // i: the instance's number
  };
  json hostMap = json::object();
  json allHosts = json::array();
  json instanceGroups = json::array();
  for (size_t i = 0; i < slots.size(); ++i) {
    Instance in;
    in.host = "algo-" + std::to_string(i + 1);
    in.group = slots[i].first;
    in.instanceType = slots[i].second;
    // With --netns every instance is reached by its name, on its own eth0 address.
    in.address = lab ? lab->addHost(in.host) + ":7077" : "127.0.0.1:" + std::to_string(ports[i]);
    if (!lab) in.controlPort = ports[slots.size() + extras + i];
    in.root = (dir / in.host).string();
    hostMap[in.host] = in.address;
    allHosts.push_back(in.host);
    instances.push_back(kj::mv(in));
  }
  if (lab) lab->writeHostsFiles();
  assignCpus(instances, spec.cpuArgs, spec.pin);
  for (auto& in : instances) {
    for (auto& [who, cpus] : spec.cpuQuotas) {
      if (who == in.host || who == in.group) in.cpuQuota = cpus;  // the last one naming it wins
    }
  }
  for (auto& g : spec.groups) {
    json hosts = json::array();
    for (auto& in : instances) {
      if (in.group == g.name) hosts.push_back(in.host);
    }
    instanceGroups.push_back(
        {{"instance_group_name", g.name}, {"instance_type", g.instanceType}, {"hosts", hosts}});
  }
  std::ofstream(dir / "hosts.json") << hostMap.dump(2) << "\n";
  for (auto& in : instances) writeRoot(in, spec, allHosts, instanceGroups, lab.has_value());
  setTorchrun(instances, spec, torchrunPort, torchrunPort(slots.size() + extras));
  // --scale-up: hosts the job's description does not name, each with a description of its own
  // (the job's plus itself in its group) and a host map that has the job's hosts and itself: what
  // a Kubernetes replica added later, or a second Slurm job, is started with.
  size_t next = slots.size();
  for (auto& u : spec.scaleUps) {
    for (unsigned k = 0; k < u.count; ++k, ++next) {
      Instance in;
      in.host = "algo-" + std::to_string(next + 1);
      in.group = u.group;
      for (auto& g : spec.groups) {
        if (g.name == u.group) in.instanceType = g.instanceType;
      }
      in.address =
          lab ? lab->addHost(in.host) + ":7077" : "127.0.0.1:" + std::to_string(ports[next]);
      in.root = (dir / in.host).string();
      in.startDelayMs = u.afterMs;
      auto hosts = allHosts;
      hosts.push_back(in.host);
      auto groups = instanceGroups;
      for (auto& g : groups) {
        if (g["instance_group_name"] == u.group) g["hosts"].push_back(in.host);
      }
      auto map = hostMap;
      map[in.host] = in.address;
      in.hostMap = (dir / ("hosts-" + in.host + ".json")).string();
      std::ofstream(in.hostMap) << map.dump(2) << "\n";
      writeRoot(in, spec, hosts, groups, lab.has_value());
      // Not a rank (DDP's ranks are the training group's at the start): a world of one.
      for (auto& [name, value] : troupe::torchrunAlone(torchrunPort(next)).variables) {
        in.torchrun.push_back(name + "=" + value);
      }
      instances.push_back(kj::mv(in));
    }
  }
  if (lab && extras > 0) lab->writeHostsFiles();
  return instances;
}

// The budgeted instances on CPUs of their own where they pack (first fit, largest first): an
// instance of 1 CPU on a whole CPU, two of 0.5 sharing one. A quota alone lets the kernel run a
// serial trainer's wake-ups behind another instance's threads, as no real instance's vCPUs do.
// Where they do not pack, or --cpus placed an instance, the quotas alone.
void packBudgets(std::vector<Instance>& instances) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  std::vector<std::pair<unsigned, double>> free;  // CPU, capacity left
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) free.emplace_back(c, 1.0);
  }
  std::vector<Instance*> order;
  for (auto& in : instances) {
    if (!in.cpus.empty()) return;
    if (in.cpuScale > 0) order.push_back(&in);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](Instance* a, Instance* b) { return a->cpuQuota > b->cpuQuota; });
  constexpr double kSlack = 1e-6;
  std::map<Instance*, std::string> lists;
  for (auto* in : order) {
    std::string list;
    if (in->cpuQuota >= 1 - kSlack) {
      size_t need = size_t(std::ceil(in->cpuQuota - kSlack));
      for (auto& [cpu, left] : free) {
        if (need == 0) break;
        if (left < 1 - kSlack) continue;
        left = 0;
        list += (list.empty() ? "" : ",") + std::to_string(cpu);
        --need;
      }
      if (need > 0) return;
    } else {
      // Best fit: the CPU with the least room that still holds it.
      std::pair<unsigned, double>* best = nullptr;
      for (auto& f : free) {
        if (f.second + kSlack >= in->cpuQuota && (!best || f.second < best->second)) best = &f;
      }
      if (!best) return;
      best->second -= in->cpuQuota;
      list = std::to_string(best->first);
    }
    lists[in] = list;
  }
  for (auto& [in, list] : lists) in->cpus = list;
}

// The CPU budget (--cpu-scale): every instance that --cpus, --pin or --cpu-quota does not place
// gets its instance type's vCPUs times the scale, so the emulated cluster has its types' CPU
// ratios. Returns why there is none where the default (auto) gives none; empty otherwise.
std::string cpuBudget(std::vector<Instance>& instances, const JobSpec& spec) {
  // Below this an instance cannot answer its heartbeats in time: no budget is closer to real.
  constexpr double kMinBudget = 0.05;
  if (spec.cpuScale == 0 || spec.pin) return "";
  bool automatic = spec.cpuScale == JobSpec::kAutoCpuScale;
  double vcpus = 0;
  for (auto& in : instances) {
    auto type = troupe::sched::findInstanceType(in.instanceType);
    if (type) vcpus += type->vcpus;
  }
  if (vcpus == 0) return automatic ? "no instance has a known instance type" : "";
  double scale = spec.cpuScale;
  if (automatic) {
    cpu_set_t set;
    double cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    scale = std::min(1.0, cpus / vcpus);
  }
  for (auto& in : instances) {
    auto type = troupe::sched::findInstanceType(in.instanceType);
    if (!type || !in.cpus.empty() || in.cpuQuota > 0) continue;
    double budget = type->vcpus * scale;
    if (budget < kMinBudget) {
      if (automatic) {
        for (auto& other : instances) {
          if (other.cpuScale > 0) other.cpuQuota = other.cpuScale = 0;
        }
        return formatCpus(scale) + " CPU per vCPU would leave " + in.host + " (" +
               in.instanceType + ") " + formatCpus(budget) + " CPUs, under " +
               formatCpus(kMinBudget);
      }
      throw std::invalid_argument("--cpu-scale " + formatCpus(scale) + " leaves " + in.host +
                                  " (" + in.instanceType + ", " + std::to_string(type->vcpus) +
                                  " vCPUs) " + formatCpus(budget) + " CPUs, under " +
                                  formatCpus(kMinBudget) + "; give a larger scale, or off");
    }
    in.cpuQuota = budget;
    in.cpuScale = scale;
  }
  // Only a quota packs onto CPUs. A weight pinned there starved: with the dnn instance pinned to
  // the other CPU, the load balancer piled every busy loop of a loaded machine onto the data
  // instances' CPU, and once one of them drained the other's cgroup got no CPU at all for 11-31 s
  // (every thread runnable, none run; bench_membership's drain, 3 of 4 under 4 busy loops). A
  // weight alone leaves its threads free to run wherever there is room.
  if (!automatic) packBudgets(instances);
  return "";
}


}  // namespace sim
