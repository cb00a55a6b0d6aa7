#include "sim_run.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <kj/debug.h>
#include <kj/io.h>

#include "cpu_quota.h"
#include "job_file.h"
#include "sim_lines.h"
#include "netns.h"
#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/process.h"
#include "troupe/sched/instance_types.h"

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

struct Instance {
  std::string host, group, instanceType, address, root, cpus;
  unsigned controlPort = 0;  // on loopback: reserved with the others (TROUPE_CONTROL_PORT)
  double cpuQuota = 0;  // --cpu-quota, or the CPU budget: CPUs (0: none)
  double cpuScale = 0;  // > 0: cpuQuota is the CPU budget, this many CPUs per vCPU
  std::unique_ptr<CpuQuotaCgroup> cgroup;
  kj::Own<troupe::ChildProcess> process;
  kj::Maybe<troupe::ChildExit> exit;  // its last process's, once the host is done
  unsigned startDelayMs = 0;          // --start-late, --scale-up
  std::string hostMap;                // --scale-up: its own (the job's plus itself)
  unsigned incarnation = 0;           // processes started so far, less one
  bool wasHead = false;               // a process of it said it is the head
  // Every process's end, first to last: pid, the wait status's code and signal.
  struct Ended {
    int pid;
    troupe::ChildExit exit;
  };
  std::vector<Ended> ended;
  int finalCode() const;
};

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
  auto ports = lab ? std::vector<unsigned>() : freePorts(2 * (slots.size() + extras));
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
  packBudgets(instances);
  return "";
}

// Whether --env runs the instances with TROUPE_INSECURE on (for `troupe status`).
bool insecure(const JobSpec& spec) {
  for (auto& e : spec.envArgs) {
    auto kv = e.substr(e.find(':') + 1);
    if (kv.rfind("TROUPE_INSECURE=", 0) != 0) continue;
    auto value = kv.substr(strlen("TROUPE_INSECURE="));
    if (value != "" && value != "0" && value != "false") return true;
  }
  return false;
}

// <dir>/exit-status/<host>: what the kernel said of the instance when it was reaped, written at
// once, so that a tool (the fault matrix) reads each instance's end from the OS's word rather
// than from what this process prints. One JSON object: host, pid, exit_status (the code when it
// exited), term_signal (the signal that ended it, or 0).
// With --node-restarts a host can have had several processes: `processes` lists each one's, first
// to last; the top-level fields are the last one's.
void writeExitStatus(const fs::path& dir, const Instance& in) {
  std::error_code ec;
  fs::create_directories(dir / "exit-status", ec);
  auto file = dir / "exit-status" / in.host;
  auto& e = in.ended.back().exit;
  json processes = json::array();
  for (auto& p : in.ended) {
    processes.push_back({{"pid", p.pid},
                         {"exit_status", p.exit.signal ? 0 : p.exit.status},
                         {"term_signal", p.exit.signal}});
  }
  json j = {{"host", in.host},
            {"pid", in.ended.back().pid},
            {"exit_status", e.signal ? 0 : e.status},
            {"term_signal", e.signal},
            {"processes", processes}};
  std::ofstream(file.string() + ".tmp") << j.dump() << "\n";
  fs::rename(file.string() + ".tmp", file, ec);
}

bool isHead(const Instance& in) {
  std::ifstream role(in.root + "/role");
  std::string word;
  role >> word;
  return word == "head";
}

std::string codeName(int code) {
  return code > 128 ? strsignal(code - 128) : troupe::exitCodeName(code);
}

// The job's outcome as SageMaker, Kubernetes and Slurm judge it: every host's final code (its
// last process's; see finalCode()). The head's code when it is not 0; else the first other host's
// that is not; without a head (none decided its role), the first failure. Prints a line per host
// whose final code is not 0, and one per host whose process was started again.
int jobStatus(const std::vector<Instance>& instances) {
  int head = 0, other = 0;
  bool headSeen = false;
  for (auto& in : instances) {
    int code = in.finalCode();
    if (in.ended.size() > 1) {
      std::string codes;
      for (auto& p : in.ended)
        codes += (codes.empty() ? "" : ", ") + std::to_string(codeOf(p.exit));
      printf("troupe sim: %s (%s) ran %zu processes (exit codes %s): final %d (%s)\n",
             in.host.c_str(), in.group.c_str(), in.ended.size(), codes.c_str(), code,
             codeName(code).c_str());
    }
    if (code != 0) {
      fprintf(stderr, "troupe sim: %s (%s) exited with %d (%s)\n", in.host.c_str(),
              in.group.c_str(), code, codeName(code).c_str());
    }
    if (in.wasHead) {
      headSeen = true;
      head = code;
    } else if (other == 0) {
      other = code;
    }
  }
  int status = headSeen && head != 0 ? head : other;
  if (headSeen && head == 0 && other != 0) {
    fprintf(stderr,
            "troupe sim: the head finished, but a host above ended with %d: SageMaker, "
            "Kubernetes and Slurm call this job failed\n",
            other);
  }
  bool allZero = true;
  for (auto& in : instances) allZero = allZero && in.finalCode() == 0;
  if (allZero) printf("troupe sim: all %zu instances exited 0\n", instances.size());
  fflush(stdout);
  fflush(stderr);
  return status;
}

}  // namespace

bool restartsNode(int status, int signal) {
  return signal != 0 || status == troupe::HEAD_LOST || status == troupe::FENCED ||
         status == troupe::INTERNAL_ERROR;
}

int finalCode(const std::vector<int>& codes) {
  if (codes.empty()) return 0;
  if (codes.size() > 1 && codes.back() == troupe::JOIN_FAILED) return codes[codes.size() - 2];
  return codes.back();
}

GroupArg parseGroup(const std::string& text) {
  GroupArg g;
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw std::invalid_argument("--group '" + text + "': expected NAME=COUNT[:INSTANCE_TYPE]");
  }
  g.name = text.substr(0, eq);
  auto rest = text.substr(eq + 1);
  auto colon = rest.find(':');
  auto count = rest.substr(0, colon);
  try {
    size_t used = 0;
    int n = std::stoi(count, &used);
    if (used != count.size() || n < 1 || n > 64) throw std::invalid_argument("range");
    g.count = n;
  } catch (const std::exception&) {
    throw std::invalid_argument("--group '" + text + "': COUNT '" + count +
                                "' must be a number from 1 to 64");
  }
  g.instanceType = colon == std::string::npos ? "ml.c5.xlarge" : rest.substr(colon + 1);
  if (g.instanceType.empty()) {
    throw std::invalid_argument("--group '" + text + "': the INSTANCE_TYPE after ':' is empty; give "
                                "one (ml.c5.xlarge) or leave out the ':' for ml.c5.xlarge");
  }
  return g;
}

std::pair<std::string, std::string> splitPair(const std::string& text, char sep,
                                              const std::string& option, const char* shape) {
  auto at = text.find(sep);
  if (at == std::string::npos || at == 0) {
    throw std::invalid_argument(option + " '" + text + "': expected " + shape);
  }
  return {text.substr(0, at), text.substr(at + 1)};
}

Runs::Runs(troupe::EventLoop& loop, JobSpec spec, fs::path dir, unsigned seed)
    : loop_(loop), spec_(kj::mv(spec)), dir_(kj::mv(dir)), seed_(seed), rng_(seed) {
  // Signals: the first starts the graceful cascade of the run in progress; the second, or the
  // grace period, kills.
  // (A copy each: kj::Function keeps a reference to an lvalue it is given.)
  auto handler = [this](int sig) {
    signalled_ = true;
    if (onSignal_) onSignal_(sig);
  };
  loop_.onSignal(SIGTERM, kj::cp(handler));
  loop_.onSignal(SIGINT, kj::cp(handler));
}

RunOutcome Runs::run(unsigned number, std::optional<Interruption> interruption) {
  auto dir = number == 1 ? dir_ : dir_ / ("run-" + std::to_string(number));
  fs::create_directories(dir);
  std::optional<NetnsLab> lab;
  if (spec_.netns) {
    NetnsLab::removeStale();
    lab.emplace(getpid());
  }
  auto instances = layOut(spec_, rng_, dir, lab);
  auto hostMapPath = dir / "hosts.json";
  // For `troupe status` with no address (job_file.h).
  JobFile job;
  job.simPid = getpid();
  job.run = number;
  job.secretFile = spec_.tokenFile;
  job.insecure = insecure(spec_);
  for (auto& in : instances) {
    job.instances.push_back({in.host, in.group, in.instanceType, in.address});
  }
  writeJobFile(dir_ / kJobFileName, job);

  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  } quiet;
  kj::TaskSet tasks(quiet);
  RunOutcome outcome;
  bool ended = false;  // the head has exited: an interruption no longer applies
  auto killAll = [&](int sig) {
    for (auto& in : instances) {
      if (in.process.get() != nullptr) in.process->kill(sig);
    }
  };
  // The interruption's clock starts now, or at the first line that names its moment.
  bool clockStarted = false;
  auto startClock = [&]() {
    if (clockStarted || !interruption) return;
    clockStarted = true;
    tasks.add(loop_.timer().afterDelay(interruption->delayMs * kj::MILLISECONDS).then([&]() {
      if (ended || signalled_) return;
      outcome.interrupted = true;
      if (interruption->hard) {
        printf(
            "troupe sim: interrupting the job: SIGKILL to every instance (capacity lost, no "
            "grace period)\n");
        fflush(stdout);
        killAll(SIGKILL);
        return;
      }
      printf(
          "troupe sim: interrupting the job as a spot reclaim does: SIGTERM to every "
          "instance, SIGKILL %u ms later\n",
          spec_.graceMs);
      fflush(stdout);
      killAll(SIGTERM);
      tasks.add(loop_.timer().afterDelay(spec_.graceMs * kj::MILLISECONDS).then([&]() {
        killAll(SIGKILL);
      }));
    }));
  };

  std::string noBudget = cpuBudget(instances, spec_);
  // Every cgroup before any process: a failure starts nothing.
  for (auto& in : instances) {
    if (in.cpuQuota <= 0) continue;
    auto name = "troupe-sim-" + std::to_string(getpid()) + "-" + std::to_string(number) + "-" + in.host;
    in.cgroup = std::make_unique<CpuQuotaCgroup>(name, in.cpuQuota);
    if (in.cgroup->why().empty()) continue;
    if (in.cpuScale > 0 && spec_.cpuScale == JobSpec::kAutoCpuScale) {
      // The default budget where cgroups cannot be made: none, said on one line.
      noBudget = in.cgroup->why();
      for (auto& other : instances) {
        if (other.cpuScale <= 0) continue;
        other.cgroup.reset();
        other.cpuQuota = other.cpuScale = 0;
        other.cpus.clear();  // packBudgets' placement
      }
      continue;
    }
    throw std::runtime_error(
        std::string(in.cpuScale > 0 ? "--cpu-scale" : "--cpu-quota") + " for " + in.host + ": " +
        in.cgroup->why() +
        "; run as root where a cgroup hierarchy has the cpu controller, or without it");
  }
  if (!noBudget.empty()) {
    printf("troupe sim: no CPU budgets (%s): the instances share this machine's CPUs\n",
           noBudget.c_str());
  } else if (!instances.empty() && instances.front().cpuScale > 0) {
    printf("troupe sim: CPU budgets: %s CPU of this machine per vCPU (--cpu-scale)\n",
           formatCpus(instances.front().cpuScale).c_str());
  }
  printf("troupe sim: %zu instances, seed %u, roots in %s\n", instances.size(), seed_, dir.c_str());
  for (auto& [who, ms] : spec_.startLate) {
    // HOST, or GROUP[:N]: that group's first N instances in host order (all without N).
    auto colon = who.find(':');
    auto name = who.substr(0, colon);
    size_t count =
        colon == std::string::npos ? instances.size() : std::stoul(who.substr(colon + 1));
    for (auto& in : instances) {
      if (in.host == name) in.startDelayMs = ms;
      if (in.group == name && count > 0) {
        in.startDelayMs = ms;
        --count;
      }
    }
  }
  // The late starts' clock (--start-late, --scale-up): now, or at the first line that names its
  // moment (--start-late-after); also when the job ends or is stopped first, so that an instance
  // whose moment never came is reported as never started, never waited for.
  auto late = kj::newPromiseAndFulfiller<void>();
  auto lateClock = late.promise.fork();
  auto releaseLate = [&, fulfiller = late.fulfiller.get()](const std::string& why) {
    if (!fulfiller->isWaiting()) return;
    if (!why.empty()) printf("troupe sim: %s: the late starts' clock starts\n", why.c_str());
    fflush(stdout);
    fulfiller->fulfill();
  };
  auto startProcess = [&](Instance& in) {
    troupe::ChildProcess::Options opts;
    opts.args = spec_.app;
    if (lab) {
      auto prefix = lab->execPrefix(in.host);
      opts.args.insert(opts.args.begin(), prefix.begin(), prefix.end());
    }
    if (in.cgroup) opts.args = in.cgroup->wrap(opts.args);
    opts.env = environment(in, spec_, in.hostMap.empty() ? hostMapPath : fs::path(in.hostMap),
                           lab.has_value());
    opts.env.push_back("TROUPE_INCARNATION=" + std::to_string(in.incarnation));
    std::string prefix = "[" + in.host + "] ";
    auto after = interruption ? interruption->after : std::string();
    opts.onLine = [prefix, after, &startClock, &releaseLate, this](kj::StringPtr line, bool err) {
      fprintf(err ? stderr : stdout, "%s%s\n", prefix.c_str(), line.cStr());
      fflush(err ? stderr : stdout);
      if (!after.empty() && strstr(line.cStr(), after.c_str()) != nullptr) startClock();
      if (!spec_.startLateAfter.empty() && strstr(line.cStr(), spec_.startLateAfter.c_str())) {
        releaseLate("--start-late-after: '" + spec_.startLateAfter + "' seen");
      }
    };
    in.process = kj::heap<troupe::ChildProcess>(loop_, kj::mv(opts));
    printf("troupe sim: %-8s %-12s %-16s %-16s pid=%d%s%s%s%s\n", in.host.c_str(), in.group.c_str(),
           in.instanceType.c_str(), in.address.c_str(), in.process->pid(),
           in.cpus.empty() ? "" : " cpus=", in.cpus.c_str(),
           in.cpuQuota > 0 ? (" cpu-quota=" + formatCpus(in.cpuQuota)).c_str() : "",
           in.incarnation > 0 ? (" incarnation=" + std::to_string(in.incarnation)).c_str() : "");
    fflush(stdout);
  };
  for (auto& in : instances) {
    if (in.startDelayMs == 0) {
      startProcess(in);
    } else {
      printf("troupe sim: %-8s %-12s %-16s %-16s starts in %u ms%s (%s)\n", in.host.c_str(),
             in.group.c_str(), in.instanceType.c_str(), in.address.c_str(), in.startDelayMs,
             spec_.startLateAfter.empty()
                 ? ""
                 : (" after a line with '" + spec_.startLateAfter + "'").c_str(),
             in.hostMap.empty() ? "--start-late" : "--scale-up: not in the cluster description");
    }
  }
  fflush(stdout);
  if (interruption && interruption->after.empty()) startClock();
  if (spec_.startLateAfter.empty()) releaseLate("");

  int signals = 0;
  onSignal_ = [&](int sig) {
    ++signals;
    releaseLate("");
    if (signals == 1) {
      fprintf(stderr, "troupe sim: %s: forwarding SIGTERM to every instance\n", strsignal(sig));
      killAll(SIGTERM);
      tasks.add(loop_.timer().afterDelay(spec_.graceMs * kj::MILLISECONDS).then([&]() {
        fprintf(stderr, "troupe sim: instances still running after %u ms: SIGKILL\n",
                spec_.graceMs);
        killAll(SIGKILL);
      }));
    } else {
      killAll(SIGKILL);
    }
  };

  // Wait for every instance. The job runs as long as its head does, whatever happens to the
  // others (a lost data instance is the head's to handle); once the head has exited, the rest get
  // `lingerMs` to follow it.
  bool lingering = false;
  // An instance is done when its last process has ended: with --node-restarts, a worker's process
  // that was killed, lost the head or was fenced is started again, as the per-instance entry
  // point does, while the job runs; the new process rejoins as the host's next incarnation.
  kj::Function<kj::Promise<troupe::ChildExit>(Instance&)> watch;
  watch = [&](Instance& in) -> kj::Promise<troupe::ChildExit> {
    return in.process->onExit().then([&](troupe::ChildExit e) -> kj::Promise<troupe::ChildExit> {
      in.ended.push_back({in.process->pid(), e});
      in.wasHead = in.wasHead || isHead(in);
      bool again = !in.wasHead && !ended && !signalled_ && signals == 0 &&
                   in.incarnation < spec_.nodeRestarts && restartsNode(e.status, e.signal);
      if (!again) return e;
      int code = codeOf(e);
      ++in.incarnation;
      printf("troupe sim: %s (%s) %s %d (%s); starting it again (restart %u of %u)\n",
             in.host.c_str(), in.group.c_str(), e.signal ? "was killed by signal" : "exited with",
             e.signal ? e.signal : code, codeName(code).c_str(), in.incarnation,
             spec_.nodeRestarts);
      startProcess(in);
      return watch(in);
    });
  };
  auto exits = kj::heapArrayBuilder<kj::Promise<void>>(instances.size());
  for (auto& in : instances) {
    auto started = in.startDelayMs == 0
                       ? kj::Promise<void>(kj::READY_NOW)
                       : lateClock.addBranch().then([&]() {
                           return loop_.timer().afterDelay(in.startDelayMs * kj::MILLISECONDS);
                         });
    exits.add(
        started
            .then([&]() -> kj::Promise<troupe::ChildExit> {
              if (in.process.get() == nullptr) {
                if (ended || signals > 0) {
                  printf("troupe sim: %s (%s) was never started: the job ended first\n",
                         in.host.c_str(), in.group.c_str());
                  return troupe::ChildExit{0, 0};
                }
                printf("troupe sim: starting %s (%s), %u ms late (%s)\n", in.host.c_str(),
                       in.group.c_str(), in.startDelayMs,
                       in.hostMap.empty() ? "--start-late" : "--scale-up");
                startProcess(in);
              }
              return watch(in);
            })
            .then([&](troupe::ChildExit e) {
              in.exit = e;
              if (in.ended.empty()) {
                in.ended.push_back({0, e});  // never started: the job ended first
              } else {
                writeExitStatus(dir, in);
              }
              if (lingering || !in.wasHead) return;
              lingering = true;
              ended = true;
              releaseLate("");
              tasks.add(loop_.timer().afterDelay(spec_.lingerMs * kj::MILLISECONDS).then([&]() {
                bool any = false;
                for (auto& other : instances) any = any || other.exit == nullptr;
                if (!any) return kj::Promise<void>(kj::READY_NOW);
                fprintf(stderr, "troupe sim: instances still running %u ms %s\n", spec_.lingerMs,
                        sim::kLingerSigterm);
                killAll(SIGTERM);
                return loop_.timer().afterDelay(spec_.graceMs * kj::MILLISECONDS).then([&]() {
                  killAll(SIGKILL);
                });
              }));
              // Evaluated now, not when the join below completes: joinPromises() only runs
              // its inputs' continuations once every input is ready, and this one starts the
              // linger timer.
            })
            .eagerlyEvaluate(nullptr));
  }
  kj::joinPromises(exits.finish()).wait(loop_.waitScope());
  onSignal_ = nullptr;
  outcome.signalled = signals > 0;

  outcome.status = jobStatus(instances);
  for (auto& in : instances) outcome.roots.emplace_back(in.host, in.root);
  instances.clear();
  lab.reset();  // also on the SIGTERM/SIGINT path, which ends here too
  return outcome;
}

}  // namespace sim
