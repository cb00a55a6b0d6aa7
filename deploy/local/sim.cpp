// `troupe sim`: a heterogeneous cluster as local processes on loopback.
//
//   troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge -- APP [ARGS]
//
// Starts one process of APP per simulated instance, each with its own cluster description in
// SageMaker's resourceconfig.json shape (under a per-instance /opt/ml-shaped root), a shared host
// map that puts every `algo-N` on a loopback port, and a fresh cluster token. Host names are dealt
// in a shuffled order across groups, as on SageMaker. Every output line is prefixed with its host.
// The simulator reaps every child, and exits with the job's status. SIGTERM or SIGINT starts the
// job's graceful cascade (the signal is forwarded to every instance); a second one, or a child
// that outlives the grace period, gets SIGKILL. Children die with the simulator even if it is
// SIGKILLed (PR_SET_PDEATHSIG, set by troupe::run).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "troupe/exit_codes.h"
#include "troupe/loop.h"
#include "troupe/process.h"

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

std::string randomToken() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 32; ++i) t += "0123456789abcdef"[rd() % 16];
  return t;
}

struct Instance {
  std::string host, group, instanceType, address, root;
  kj::Own<troupe::ChildProcess> process;
  kj::Maybe<troupe::ChildExit> exit;
};

}  // namespace

int main(int argc, char* argv[]) {
  CLI::App cli("troupe: a Ray-like actor runtime for heterogeneous clusters");
  cli.require_subcommand(1);
  auto* sim = cli.add_subcommand("sim", "run APP as a simulated heterogeneous cluster on loopback");
  std::vector<std::string> groupArgs;
  std::string headGroup, token;
  unsigned seed = 0, graceMs = 10000, lingerMs = 15000;
  bool keep = false;
  std::vector<std::string> app;
  sim->add_option("--group", groupArgs, "NAME=COUNT[:INSTANCE_TYPE], repeatable")
      ->default_str("data_group=2:ml.c5.xlarge dnn_group=1:ml.p3.2xlarge");
  sim->add_option("--head-group", headGroup, "the group whose first host is the head");
  sim->add_option("--token", token, "cluster token (default: a fresh random one)");
  sim->add_option("--seed", seed, "seed for dealing host names (default: random)");
  sim->add_option("--grace-ms", graceMs, "after a signal, how long instances get to exit");
  sim->add_option("--linger-ms", lingerMs,
                  "after the first instance exits, how long the others get before SIGTERM");
  sim->add_flag("--keep", keep, "keep the per-instance roots (printed at start)");
  std::vector<std::string> envArgs;
  sim->add_option("--env", envArgs,
                  "HOST_OR_GROUP:KEY=VALUE, an extra environment variable for some instances");
  // Everything from the app's path on belongs to the app.
  sim->prefix_command();
  sim->footer("APP [ARGS...] follows the options, after an optional --");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : troupe::CONFIG_ERROR;
  }
  app = sim->remaining();
  if (!app.empty() && app[0] == "--") app.erase(app.begin());
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
  if (access(app[0].c_str(), X_OK) != 0) {
    fprintf(stderr, "troupe sim: app '%s' is not an executable file; build it first\n",
            app[0].c_str());
    return troupe::CONFIG_ERROR;
  }
  if (token.empty()) token = randomToken();
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
  std::vector<Instance> instances;
  json hostMap = json::object();
  json allHosts = json::array();
  json instanceGroups = json::array();
  for (size_t i = 0; i < slots.size(); ++i) {
    Instance in;
    in.host = "algo-" + std::to_string(i + 1);
    in.group = slots[i].first;
    in.instanceType = slots[i].second;
    in.address = "127.0.0.1:" + std::to_string(freePort());
    hostMap[in.host] = in.address;
    allHosts.push_back(in.host);
    instances.push_back(kj::mv(in));
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
    fs::create_directories(root / "output");
    json rc = {{"current_host", in.host},
               {"current_group_name", in.group},
               {"current_instance_type", in.instanceType},
               {"hosts", allHosts},
               {"network_interface_name", "lo"},
               {"instance_groups", instanceGroups}};
    std::ofstream(root / "input" / "config" / "resourceconfig.json") << rc.dump(2) << "\n";
    std::ofstream(root / "input" / "config" / "hyperparameters.json") << "{}\n";
    in.root = root.string();
  }

  troupe::EventLoop loop(1);
  std::vector<std::string> baseEnv;
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "TROUPE_", 7) != 0) baseEnv.push_back(*e);
  }
  printf("troupe sim: %zu instances, seed %u, roots in %s\n", instances.size(), seed,
         dir.c_str());
  for (auto& in : instances) {
    troupe::ChildProcess::Options opts;
    opts.args = app;
    opts.env = baseEnv;
    opts.env.push_back("TROUPE_SM_ROOT=" + in.root);
    opts.env.push_back("TROUPE_CLUSTER_FILE=" + in.root + "/input/config/resourceconfig.json");
    opts.env.push_back("TROUPE_HOST_MAP=" + hostMapPath.string());
    opts.env.push_back("TROUPE_TOKEN=" + token);
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
      opts.env.push_back(kv);
    }
    std::string prefix = "[" + in.host + "] ";
    opts.onLine = [prefix](kj::StringPtr line, bool err) {
      fprintf(err ? stderr : stdout, "%s%s\n", prefix.c_str(), line.cStr());
      fflush(err ? stderr : stdout);
    };
    in.process = kj::heap<troupe::ChildProcess>(loop, kj::mv(opts));
    printf("troupe sim: %-8s %-12s %-16s %-16s pid=%d\n", in.host.c_str(), in.group.c_str(),
           in.instanceType.c_str(), in.address.c_str(), in.process->pid());
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

  // Wait for every instance; once one has exited, the rest get `lingerMs` to follow.
  bool lingering = false;
  auto exits = kj::heapArrayBuilder<kj::Promise<void>>(instances.size());
  for (auto& in : instances) {
    exits.add(in.process->onExit().then([&](troupe::ChildExit e) {
      in.exit = e;
      if (!lingering) {
        lingering = true;
        tasks.add(loop.timer().afterDelay(lingerMs * kj::MILLISECONDS).then([&]() {
          bool any = false;
          for (auto& other : instances) any = any || other.exit == nullptr;
          if (!any) return kj::Promise<void>(kj::READY_NOW);
          fprintf(stderr, "troupe sim: instances still running %u ms after the first exit: "
                  "SIGTERM\n", lingerMs);
          killAll(SIGTERM);
          return loop.timer().afterDelay(graceMs * kj::MILLISECONDS).then([&]() {
            killAll(SIGKILL);
          });
        }));
      }
    }));
  }
  kj::joinPromises(exits.finish()).wait(loop.waitScope());

  // The job's status: the head's, or else the first failure.
  int status = 0;
  for (auto& in : instances) {
    auto e = KJ_ASSERT_NONNULL(in.exit);
    int code = e.signal ? 128 + e.signal : static_cast<int>(e.status);
    if (code != 0) {
      fprintf(stderr, "troupe sim: %s (%s) exited with %d (%s)\n", in.host.c_str(),
              in.group.c_str(), code,
              e.signal ? strsignal(e.signal) : troupe::exitCodeName(code));
      if (status == 0) status = code;
    }
  }
  if (status == 0) printf("troupe sim: all %zu instances exited 0\n", instances.size());
  fflush(stdout);
  instances.clear();
  if (!keep) fs::remove_all(dir);
  return status;
}
