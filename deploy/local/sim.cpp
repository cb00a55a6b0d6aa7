// `troupe sim`: a heterogeneous cluster as local processes on loopback.
//
//   troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge
//              --hp epochs=3 --channel train=/usr/share/datasets/fashion-mnist --pin -- APP [ARGS]
//
// Starts one process of APP per simulated instance, each with its own /opt/ml-shaped root
// (TROUPE_SM_ROOT) holding what SageMaker gives an instance: input/config/resourceconfig.json in
// SageMaker's shape, input/config/hyperparameters.json (--hp, every value a string),
// input/data/<channel> (--channel, a symbolic link to a shared path), model/ and output/ (where
// the instance writes `success` or `failure`). A shared host map puts every `algo-N` on a
// loopback port, or with --netns each instance is a host of its own on a virtual network
// (netns.h). --pin gives each instance a CPU set (TROUPE_CPUS, applied by troupe::run) so a small
// machine can emulate a CPU:GPU ratio. The job secret (a fresh one, or --token-file's) is a file
// of mode 0600 beside the roots, in none of them; instances get its path (TROUPE_TOKEN_FILE), never
// the secret. Host names are dealt in a shuffled order across groups, as on SageMaker. Every
// output line is prefixed with its host, like SageMaker's log streams. The simulator reaps every
// child, and exits with the job's status: the head's exit code (each instance writes its role to
// TROUPE_ROLE_FILE), also when other instances were lost on the way.
// SIGTERM or SIGINT starts the job's graceful cascade (the signal is forwarded to every instance);
// a second one, or a child that outlives the grace period, gets SIGKILL. Children die with the
// simulator even if it is SIGKILLed (PR_SET_PDEATHSIG, set by troupe::run).

#include <arpa/inet.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <random>

#include "netns.h"
#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/loop.h"
#include "troupe/sagemaker.h"
#include "troupe/process.h"
#include "troupe/secret.h"
#include "troupe/sched/instance_types.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct GroupArg {
  std::string name;
  unsigned count = 1;
  std::string instanceType;
};

GroupArg parseGroup(const std::string& text) {
  // NAME=COUNT[:TYPE]
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
  return g;
}

unsigned freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  unsigned port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

struct Instance {
  std::string host, group, instanceType, address, root, cpus;
  kj::Own<troupe::ChildProcess> process;
  kj::Maybe<troupe::ChildExit> exit;
};

std::pair<std::string, std::string> splitPair(const std::string& text, char sep,
                                              const std::string& option, const char* shape) {
  auto at = text.find(sep);
  if (at == std::string::npos || at == 0) {
    throw std::invalid_argument(option + " '" + text + "': expected " + shape);
  }
  return {text.substr(0, at), text.substr(at + 1)};
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

// `troupe env`: the cluster description and SageMaker environment a node reads, through the same
// functions troupe::run() uses.
int printEnvironment(std::string root) {
  if (root.empty()) root = troupe::SageMakerEnv::defaultRoot();
  try {
    auto sm = troupe::SageMakerEnv::load(root);
    auto config = troupe::ClusterConfig::load(sm.resourceConfigPath());
    json groups = json::object();
    for (auto& g : config.groups) {
      groups[g.name] = {{"instance_type", g.instanceType}, {"hosts", g.hosts}};
    }
    json hps = json::object();
    for (auto& key : sm.keys()) hps[key] = json::parse(sm.getJson(key));
    json out = {{"root", sm.root()},
                {"current_host", config.currentHost},
                {"current_group", config.currentGroup},
                {"current_instance_type", config.currentInstanceType},
                {"network_interface", config.networkInterface},
                {"hosts", config.hosts},
                {"groups", groups},
                {"is_heterogeneous", config.groups.size() > 1},
                {"head", config.headHost("")},
                {"hyperparameters", hps},
                {"channels", sm.channels()}};
    printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const troupe::ConfigError& e) {
    fprintf(stderr, "troupe env: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
}

}  // namespace

int runSim(int argc, char* argv[]) {
  CLI::App cli("troupe: a Ray-like actor runtime for heterogeneous clusters");
  cli.require_subcommand(1);
  auto* sim = cli.add_subcommand("sim", "run APP as a simulated heterogeneous cluster on loopback");
  auto* envCmd = cli.add_subcommand(
      "env",
      "print, as JSON, what a node sees in a SageMaker-shaped root: host, group, groups, "
      "hyperparameters (decoded), channels");
  std::string envRoot;
  envCmd->add_option("--root", envRoot, "the root (default: $TROUPE_SM_ROOT, else /opt/ml)");
  std::vector<std::string> groupArgs;
  std::string headGroup, tokenFile, refusedToken;
  unsigned seed = 0, graceMs = 10000, lingerMs = 15000;
  bool keep = false;
  std::vector<std::string> app;
  sim->add_option("--group", groupArgs, "NAME=COUNT[:INSTANCE_TYPE], repeatable")
      ->default_str("data_group=2:ml.c5.xlarge dnn_group=1:ml.p3.2xlarge");
  sim->add_option("--head-group", headGroup, "the group whose first host is the head");
  sim->add_option("--token-file", tokenFile,
                  "a file only you can read holding the job secret (default: a fresh one)");
  sim->add_option("--token", refusedToken)->group("");  // refused below, with the reason
  sim->add_option("--seed", seed, "seed for dealing host names (default: random)");
  sim->add_option("--grace-ms", graceMs, "after a signal, how long instances get to exit");
  sim->add_option("--linger-ms", lingerMs,
                  "after the head exits, how long the others get before SIGTERM");
  sim->add_flag("--keep", keep, "keep the per-instance roots (printed at start)");
  std::vector<std::string> envArgs, hpArgs, channelArgs, cpuArgs;
  bool pin = false, netns = false;
  sim->add_option("--env", envArgs,
                  "HOST_OR_GROUP:KEY=VALUE, an extra environment variable for some instances");
  sim->add_option("--hp", hpArgs,
                  "KEY=VALUE, a hyperparameter in every instance's hyperparameters.json");
  sim->add_option("--channel", channelArgs,
                  "NAME=PATH, an input channel: input/data/NAME links to PATH on every instance");
  sim->add_flag("--pin", pin,
                "pin each instance to its own CPUs, in proportion to its instance type's vCPUs");
  sim->add_option("--cpus", cpuArgs, "HOST_OR_GROUP=CPU_LIST, the CPUs of some instances");
  sim->add_flag("--netns", netns,
                "root only: each instance in its own network namespace, a host of its own");
  // Everything from the app's path on belongs to the app.
  sim->prefix_command();
  sim->footer("APP [ARGS...] follows the options, after an optional --");
  // The app starts after the first "--" (CLI11's prefix_command() trips over "--" after some
  // options), or else at the first argument that is not an option.
  int cliArgc = argc;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--") == 0) {
      app.assign(argv + i + 1, argv + argc);
      cliArgc = i;
      break;
    }
  }
  try {
    cli.parse(cliArgc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : troupe::CONFIG_ERROR;
  }
  if (envCmd->parsed()) return printEnvironment(envRoot);
  try {
    if (!refusedToken.empty()) troupe::refuseSecretArgument("--token");
    if (!tokenFile.empty()) {
      troupe::readSecretFile(tokenFile);  // its errors now, not once per instance
      tokenFile = fs::absolute(tokenFile).string();
    }
  } catch (const troupe::ConfigError& e) {
    fprintf(stderr, "troupe sim: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
  if (cliArgc == argc) app = sim->remaining();
  if (app.empty()) {
    fprintf(stderr, "troupe sim: no app given; usage: troupe sim [OPTIONS] -- APP [ARGS...]\n");
    return troupe::CONFIG_ERROR;
  }

  std::vector<GroupArg> groups;
  try {
    if (groupArgs.empty()) groupArgs = {"data_group=2:ml.c5.xlarge", "dnn_group=1:ml.p3.2xlarge"};
    for (auto& g : groupArgs) groups.push_back(parseGroup(g));
  } catch (const std::invalid_argument& e) {
    fprintf(stderr, "troupe sim: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
  for (auto& e : envArgs) {
    auto colon = e.find(':');
    if (colon == std::string::npos || e.find('=', colon) == std::string::npos) {
      fprintf(stderr, "troupe sim: --env '%s': expected HOST_OR_GROUP:KEY=VALUE\n", e.c_str());
      return troupe::CONFIG_ERROR;
    }
  }
  json hyperparameters = json::object();
  std::vector<std::pair<std::string, fs::path>> channels;
  try {
    for (auto& h : hpArgs) {
      auto [key, value] = splitPair(h, '=', "--hp", "KEY=VALUE");
      hyperparameters[key] = value;  // SageMaker passes every value as a string
    }
    for (auto& c : channelArgs) {
      auto [name, path] = splitPair(c, '=', "--channel", "NAME=PATH");
      if (name.find('/') != std::string::npos || !fs::exists(path)) {
        throw std::invalid_argument("--channel '" + c + "': " +
                                    (fs::exists(path) ? "NAME must not contain '/'"
                                                      : "PATH '" + path + "' does not exist"));
      }
      channels.emplace_back(name, fs::absolute(path));
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "troupe sim: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
  if (netns) {
    auto why = sim::NetnsLab::unavailableReason();
    if (!why.empty()) {
      fprintf(stderr, "troupe sim: --netns is not available: %s; run without --netns (loopback)\n",
              why.c_str());
      return troupe::CONFIG_ERROR;
    }
  }
  if (access(app[0].c_str(), X_OK) != 0) {
    fprintf(stderr, "troupe sim: app '%s' is not an executable file; build it first\n",
            app[0].c_str());
    return troupe::CONFIG_ERROR;
  }
  if (seed == 0) seed = std::random_device()();

  // Deal host names in a shuffled order across groups, like SageMaker's algo-N.
  std::vector<std::pair<std::string, std::string>> slots;  // group, type
  for (auto& g : groups) {
    for (unsigned i = 0; i < g.count; ++i) slots.emplace_back(g.name, g.instanceType);
  }
  std::mt19937 rng(seed);
  std::shuffle(slots.begin(), slots.end(), rng);

  auto dir = fs::temp_directory_path() / ("troupe-sim-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct RemoveDir {
    fs::path dir;
    bool keep;
    ~RemoveDir() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } removeDir{dir, keep};
  // The job's secret: in the simulator's folder, beside the roots and in none of them, as on
  // SageMaker (where it is not a file under /opt/ml an app could save with its model). Removed at
  // the end even with --keep.
  struct RemoveFile {
    fs::path file;
    ~RemoveFile() {
      std::error_code ec;
      if (!file.empty()) fs::remove(file, ec);
    }
  } removeSecret;
  if (tokenFile.empty()) {
    try {
      tokenFile = (dir / "secret").string();
      troupe::writeSecretFile(tokenFile, troupe::randomToken());
      removeSecret.file = tokenFile;
    } catch (const troupe::ConfigError& e) {
      fprintf(stderr, "troupe sim: %s\n", e.what());
      return troupe::CONFIG_ERROR;
    }
  }
  std::vector<Instance> instances;
  json hostMap = json::object();
  json allHosts = json::array();
  json instanceGroups = json::array();
  std::optional<sim::NetnsLab> lab;
  try {
    if (netns) {
      sim::NetnsLab::removeStale();
      lab.emplace(getpid());
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      Instance in;
      in.host = "algo-" + std::to_string(i + 1);
      in.group = slots[i].first;
      in.instanceType = slots[i].second;
      // With --netns every instance is reached by its name, on its own eth0 address.
      in.address =
          lab ? lab->addHost(in.host) + ":7077" : "127.0.0.1:" + std::to_string(freePort());
      hostMap[in.host] = in.address;
      allHosts.push_back(in.host);
      instances.push_back(kj::mv(in));
    }
    if (lab) lab->writeHostsFiles();
    assignCpus(instances, cpuArgs, pin);
  } catch (const std::exception& e) {
    fprintf(stderr, "troupe sim: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
  for (auto& g : groups) {
    json hosts = json::array();
    for (auto& in : instances) {
      if (in.group == g.name) hosts.push_back(in.host);
    }
    instanceGroups.push_back(
        {{"instance_group_name", g.name}, {"instance_type", g.instanceType}, {"hosts", hosts}});
  }
  auto hostMapPath = dir / "hosts.json";
  std::ofstream(hostMapPath) << hostMap.dump(2) << "\n";
  for (auto& in : instances) {
    auto root = dir / in.host;
    fs::create_directories(root / "input" / "config");
    fs::create_directories(root / "model");
    fs::create_directories(root / "output" / "data");
    fs::create_directories(root / "input" / "data");
    json rc = {{"current_host", in.host},
               {"current_group_name", in.group},
               {"current_instance_type", in.instanceType},
               {"hosts", allHosts},
               {"network_interface_name", lab ? "eth0" : "lo"},
               {"instance_groups", instanceGroups}};
    std::ofstream(root / "input" / "config" / "resourceconfig.json") << rc.dump(2) << "\n";
    std::ofstream(root / "input" / "config" / "hyperparameters.json")
        << hyperparameters.dump(2) << "\n";
    json dataConfig = json::object();
    for (auto& [name, path] : channels) {
      fs::create_symlink(path, root / "input" / "data" / name);
      dataConfig[name] = {{"TrainingInputMode", "File"},
                          {"S3DistributionType", "FullyReplicated"},
                          {"RecordWrapperType", "None"}};
    }
    std::ofstream(root / "input" / "config" / "inputdataconfig.json") << dataConfig.dump(2) << "\n";
    in.root = root.string();
  }

  troupe::EventLoop loop(1);
  std::vector<std::string> baseEnv;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "TROUPE_", 7) != 0) baseEnv.push_back(*e);
  }
  printf("troupe sim: %zu instances, seed %u, roots in %s\n", instances.size(), seed, dir.c_str());
  for (auto& in : instances) {
    troupe::ChildProcess::Options opts;
    opts.args = app;
    if (lab) {
      auto prefix = lab->execPrefix(in.host);
      opts.args.insert(opts.args.begin(), prefix.begin(), prefix.end());
    }
    opts.env = baseEnv;
    // The root alone, as on SageMaker: the node finds resourceconfig.json in it.
    opts.env.push_back("TROUPE_SM_ROOT=" + in.root);
    if (!lab) opts.env.push_back("TROUPE_HOST_MAP=" + hostMapPath.string());
    if (!in.cpus.empty()) opts.env.push_back("TROUPE_CPUS=" + in.cpus);
    // The secret's path, never the secret: a process's environment is readable in /proc.
    opts.env.push_back("TROUPE_TOKEN_FILE=" + tokenFile);
    opts.env.push_back("TROUPE_ROLE_FILE=" + in.root + "/role");
    opts.env.push_back("TROUPE_DIE_WITH_PARENT=" + std::to_string(getpid()));
    if (!headGroup.empty()) opts.env.push_back("TROUPE_HEAD_GROUP=" + headGroup);
    for (auto& e : envArgs) {
      auto colon = e.find(':');
      auto who = e.substr(0, colon);
      if (who != in.host && who != in.group) continue;
      // Replace a variable set above rather than add a second one (getenv finds the first).
      auto kv = e.substr(colon + 1);
      auto key = kv.substr(0, kv.find('=') + 1);
      std::erase_if(opts.env, [&](const std::string& v) { return v.rfind(key, 0) == 0; });
      // A secret of its own (a wrong-secret test) replaces the job's, in either form.
      if (key == "TROUPE_TOKEN=" || key == "TROUPE_TOKEN_FILE=") {
        std::erase_if(opts.env, [](const std::string& v) {
          return v.rfind("TROUPE_TOKEN=", 0) == 0 || v.rfind("TROUPE_TOKEN_FILE=", 0) == 0;
        });
      }
      opts.env.push_back(kv);
    }
    std::string prefix = "[" + in.host + "] ";
    opts.onLine = [prefix](kj::StringPtr line, bool err) {
      fprintf(err ? stderr : stdout, "%s%s\n", prefix.c_str(), line.cStr());
      fflush(err ? stderr : stdout);
    };
    in.process = kj::heap<troupe::ChildProcess>(loop, kj::mv(opts));
    printf("troupe sim: %-8s %-12s %-16s %-16s pid=%d%s%s\n", in.host.c_str(), in.group.c_str(),
           in.instanceType.c_str(), in.address.c_str(), in.process->pid(),
           in.cpus.empty() ? "" : " cpus=", in.cpus.c_str());
  }
  fflush(stdout);

  // Signals: the first starts the graceful cascade; the second, or the grace period, kills.
  int signals = 0;
  auto killAll = [&](int sig) {
    for (auto& in : instances) in.process->kill(sig);
  };
  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  } quiet;
  kj::TaskSet tasks(quiet);
  auto onSignal = [&](int sig) {
    ++signals;
    if (signals == 1) {
      fprintf(stderr, "troupe sim: %s: forwarding SIGTERM to every instance\n", strsignal(sig));
      killAll(SIGTERM);
      tasks.add(loop.timer().afterDelay(graceMs * kj::MILLISECONDS).then([&]() {
        fprintf(stderr, "troupe sim: instances still running after %u ms: SIGKILL\n", graceMs);
        killAll(SIGKILL);
      }));
    } else {
      killAll(SIGKILL);
    }
  };
  loop.onSignal(SIGTERM, onSignal);
  loop.onSignal(SIGINT, onSignal);

  // Wait for every instance. The job runs as long as its head does, whatever happens to the
  // others (a lost data instance is the head's to handle); once the head has exited, the rest get
  // `lingerMs` to follow it.
  auto isHead = [](const Instance& in) {
    std::ifstream role(in.root + "/role");
    std::string word;
    role >> word;
    return word == "head";
  };
  bool lingering = false;
  auto exits = kj::heapArrayBuilder<kj::Promise<void>>(instances.size());
  for (auto& in : instances) {
    exits.add(in.process->onExit()
                  .then([&](troupe::ChildExit e) {
                    in.exit = e;
                    if (lingering || !isHead(in)) return;
                    lingering = true;
                    tasks.add(loop.timer().afterDelay(lingerMs * kj::MILLISECONDS).then([&]() {
                      bool any = false;
                      for (auto& other : instances) any = any || other.exit == nullptr;
                      if (!any) return kj::Promise<void>(kj::READY_NOW);
                      fprintf(stderr,
                              "troupe sim: instances still running %u ms after the head exited: "
                              "SIGTERM\n",
                              lingerMs);
                      killAll(SIGTERM);
                      return loop.timer().afterDelay(graceMs * kj::MILLISECONDS).then([&]() {
                        killAll(SIGKILL);
                      });
                    }));
                    // Evaluated now, not when the join below completes: joinPromises() only runs
                    // its inputs' continuations once every input is ready, and this one starts the
                    // linger timer.
                  })
                  .eagerlyEvaluate(nullptr));
  }
  kj::joinPromises(exits.finish()).wait(loop.waitScope());

  // The job's outcome is the head's status; without a head (it never decided its role), the
  // first failure.
  int status = 0;
  bool headSeen = false;
  for (auto& in : instances) {
    auto e = KJ_ASSERT_NONNULL(in.exit);
    int code = e.signal ? 128 + e.signal : static_cast<int>(e.status);
    if (code != 0) {
      fprintf(stderr, "troupe sim: %s (%s) exited with %d (%s)\n", in.host.c_str(),
              in.group.c_str(), code, e.signal ? strsignal(e.signal) : troupe::exitCodeName(code));
    }
    if (isHead(in)) {
      headSeen = true;
      status = code;
    } else if (!headSeen && status == 0) {
      status = code;
    }
  }
  if (headSeen && status == 0) {
    for (auto& in : instances) {
      auto e = KJ_ASSERT_NONNULL(in.exit);
      if (e.signal || e.status != 0) {
        printf("troupe sim: the job succeeded; the instances above were lost on the way\n");
        break;
      }
    }
  }
  bool allZero = true;
  for (auto& in : instances) {
    auto e = KJ_ASSERT_NONNULL(in.exit);
    allZero = allZero && !e.signal && e.status == 0;
  }
  if (allZero) printf("troupe sim: all %zu instances exited 0\n", instances.size());
  fflush(stdout);
  instances.clear();
  lab.reset();  // also on the SIGTERM/SIGINT path, which ends here too
  return status;
}

int main(int argc, char* argv[]) {
  // Caught here so that the stack unwinds: the per-instance roots and --netns namespaces are
  // removed by destructors.
  try {
    return runSim(argc, argv);
  } catch (const kj::Exception& e) {
    fprintf(stderr, "troupe sim: internal error: %s\n", e.getDescription().cStr());
  } catch (const std::exception& e) {
    fprintf(stderr, "troupe sim: internal error: %s\n", e.what());
  }
  return troupe::INTERNAL_ERROR;
}
