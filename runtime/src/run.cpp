// troupe::run(): options, role, cluster formation (workers), and the end of the process.

#include "troupe/run.h"

#include <errno.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <random>

#include "config/run_options_cli.h"
#include "head/head.h"
#include "loop/log_sink.h"
#include "node/node.h"
#include "troupe/app_settings.h"
#include "troupe/exit_codes.h"
#include "troupe/node_size.h"
#include "troupe/sagemaker.h"
#include "troupe/sched/instance_types.h"
#include "troupe/secret.h"
#include "troupe/log.h"
#include "troupe/trace.h"
#include "worker/worker.h"

namespace troupe {

namespace {

[[noreturn]] void endProcess(int code) {
  // Flush the logger, never destroy it: another thread (the control thread, the pool) may log
  // until _exit ends it, and spdlog::shutdown() freed the logger under one (a segfault at exit,
  // 1 of 10 runs of 256 instances with --netns).
  if (auto* logger = spdlog::default_logger_raw()) logger->flush();
  fflush(stdout);
  fflush(stderr);
  _exit(code);
}

void setupLogging(const std::string& tag, const std::string& level) {
  // A terminal gets colours; a pipe or a file (troupe sim, Slurm, SageMaker's log agent) the sink
  // that never blocks the loop on a reader that stopped (loop/log_sink.h).
  std::shared_ptr<spdlog::logger> logger;
  if (isatty(STDERR_FILENO)) {
    logger = spdlog::stderr_color_mt("troupe");
  } else {
    logger = std::make_shared<spdlog::logger>("troupe",
                                              std::make_shared<NonBlockingSink>(STDERR_FILENO));
    spdlog::register_logger(logger);
  }
  logger->set_pattern("%H:%M:%S.%e %^%-5l%$ [" + tag + "] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

std::string localHostName() {
  char name[256] = "";
  gethostname(name, sizeof(name) - 1);
  return name;
}

std::string allowedCpus() {
  cpu_set_t set;
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return formatCpuList(cpus);
}

struct Parsed {
  std::vector<std::string> appArgs;  // what troupe does not take: the app's own arguments
  bool headGroupGiven = false;       // --head-group or TROUPE_HEAD_GROUP, not the app's default
};

// The secret from --token-file / TROUPE_TOKEN_FILE or TROUPE_TOKEN (already taken out of the
// environment), else the app's default, checked. loadCluster() looks further (troupe/secret.h).
void readSecret(RunOptions& o, const std::string& fromEnvironment) {
  if (!o.tokenFile.empty() && !fromEnvironment.empty()) {
    throw ConfigError("the job secret is given twice, in TROUPE_TOKEN and in the file '" +
                      o.tokenFile + "' (--token-file, TROUPE_TOKEN_FILE); give one, the file");
  }
  if (!o.tokenFile.empty()) {
    o.token = readSecretFile(o.tokenFile);
  } else if (!fromEnvironment.empty()) {
    checkSecret(fromEnvironment, "TROUPE_TOKEN");
    o.token = fromEnvironment;
  } else if (!o.token.empty()) {
    checkSecret(o.token, "RunOptions::token");
  }
}

// Parses flags and TROUPE_* variables over the app's defaults.
Parsed parseOptions(int argc, char* argv[], RunOptions& o) {
  // First of all, so that TROUPE_TOKEN is gone whatever fails below.
  auto secretFromEnvironment = takeSecretFromEnvironment();
  CLI::App cli("troupe node");
  cli.allow_extras();
  addRunOptions(cli, o);
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(cli.exit(e));
  } catch (const CLI::ParseError& e) {
    throw ConfigError(std::string("bad option: ") + e.what() + " (see --troupe-help)");
  }
  Parsed parsed;
  parsed.appArgs = cli.remaining();
  for (auto& arg : parsed.appArgs) refuseSecretArgument(arg);
  readSecret(o, secretFromEnvironment);
  parsed.headGroupGiven = cli.get_option("--head-group")->count() > 0;
  if (o.heartbeatMs == 0 || o.nodeTimeoutMs <= o.heartbeatMs || o.headTimeoutMs <= o.heartbeatMs) {
    throw ConfigError("heartbeat-ms (" + std::to_string(o.heartbeatMs) +
                      ") must be > 0 and below node-timeout-ms (" +
                      std::to_string(o.nodeTimeoutMs) + ") and head-timeout-ms (" +
                      std::to_string(o.headTimeoutMs) + ")");
  }
  if (o.nodeTimeoutMaxMs == 0) o.nodeTimeoutMaxMs = 2 * o.nodeTimeoutMs;
  if (o.nodeTimeoutMaxMs < o.nodeTimeoutMs) {
    throw ConfigError("node-timeout-max-ms (" + std::to_string(o.nodeTimeoutMaxMs) +
                      ") must be at least node-timeout-ms (" + std::to_string(o.nodeTimeoutMs) +
                      "); leave it out for twice node-timeout-ms");
  }
  if (o.controlPort > 65535) {
    throw ConfigError("control-port " + std::to_string(o.controlPort) +
                      " is not a port; give 1-65535, or 0 for any free port");
  }
  // Checked here, before anything starts, so that a bad one is exit 2 naming it.
  parseLabels(o.labels, "--labels (TROUPE_LABELS)");
  parseResources(o.resources, "--resources (TROUPE_RESOURCES)");
  return parsed;
}

struct Loaded {
  ClusterConfig config;
  HostMap hosts;
};

bool smRootGiven() {
  const char* root = getenv("TROUPE_SM_ROOT");
  return root != nullptr && *root != '\0';
}

std::string smClusterFile() {
  return SageMakerEnv::defaultRoot() + "/input/config/resourceconfig.json";
}

// Whether this process runs under a SageMaker-shaped root, whose output/ then gets the outcome
// file: TROUPE_SM_ROOT is set, or the cluster file is (or will be) the root's. A developer machine
// that merely lacks a cluster file never gets files written into /opt/ml.
bool underSageMaker(const RunOptions& o) {
  if (smRootGiven()) return true;
  if (o.clusterFile.empty()) return std::filesystem::exists(smClusterFile());
  return o.clusterFile == smClusterFile();
}

Loaded loadCluster(RunOptions& o) {
  Loaded l;
  // With TROUPE_SM_ROOT set the root's file is the description, so a missing one is an error.
  if (o.clusterFile.empty() && (smRootGiven() || std::filesystem::exists(smClusterFile()))) {
    o.clusterFile = smClusterFile();
  }
  if (!o.clusterFile.empty()) {
    l.config = ClusterConfig::load(o.clusterFile);
  } else {
    auto env = processEnvironment();
    if (auto slurm = clusterFromSlurm(env)) {
      l.config = ClusterConfig::parse(*slurm,
                                      "the Slurm job's environment (SLURMD_NODENAME, "
                                      "SLURM_JOB_NODELIST*, TROUPE_SLURM_GROUPS)");
    } else if (auto k8s = clusterFromK8s(env)) {
      l.config = ClusterConfig::parse(*k8s, "the pod's environment (TROUPE_K8S_GROUPS, HOSTNAME)");
    } else {
      // No description: a one-node cluster on this machine, handy for a first run.
      l.config = ClusterConfig::parse(R"({"current_host":"localhost","hosts":["localhost"],
                                          "current_group_name":"local"})",
                                      "(built-in single-node cluster)");
      l.hosts.addresses["localhost"] = "127.0.0.1:0";
      if (o.token.empty()) o.token = randomToken();
      return l;
    }
  }
  if (underSageMaker(o)) {
    auto sm = SageMakerEnv::load(SageMakerEnv::defaultRoot());
    refuseSecretHyperparameter(sm);
    if (o.token.empty()) o.token = readChannelSecret(sm);
  }
  if (!o.hostMapFile.empty()) l.hosts = HostMap::load(o.hostMapFile);
  l.hosts.defaultPort = o.port;
  if (o.token.empty()) {
    if (l.config.hosts.size() > 1) {
      throw ConfigError(
          "no job secret: give every instance of the job the same secret in a file only its "
          "owner can read, with --token-file FILE or TROUPE_TOKEN_FILE=FILE (make one with: "
          "(umask 077; openssl rand -hex 16 > secret)); on SageMaker, the input channel "
          "'troupe-secret' (deploy/sagemaker/launch.py)");
    }
    o.token = randomToken();
  }
  return l;
}

// Listen on the interface the description names (SageMaker: network_interface_name, "eth0"),
// not on every address, unless the host map already says where this host listens.
void listenOnInterface(Loaded& l) {
  auto& c = l.config;
  if (c.networkInterface.empty() || l.hosts.addresses.count(c.currentHost) != 0) return;
  auto ip = interfaceAddress(c.networkInterface);
  if (!ip) {
    spdlog::warn(
        "network interface '{}' (network_interface_name in {}) does not exist or has no "
        "IPv4 address; listening on every address",
        c.networkInterface, c.source);
    return;
  }
  l.hosts.addresses[c.currentHost] = *ip + ":" + std::to_string(l.hosts.defaultPort);
}

// The app's head group (RunOptions::headGroup, hetero_train's dnn_group) is a default: on a cluster
// without it (a homogeneous SageMaker job) the default head is used instead, and the returned
// warning says so. One named on purpose (--head-group, TROUPE_HEAD_GROUP) must exist.
std::optional<std::string> resolveHeadGroup(const ClusterConfig& c, RunOptions& o, bool given) {
  auto missing = c.missingHeadGroup(o.headGroup);
  if (!missing) return std::nullopt;
  if (given) {
    std::vector<std::string> names;
    for (auto& g : c.groups) names.push_back(g.name);
    auto near = nearestName(o.headGroup, names);
    throw ConfigError("--head-group (TROUPE_HEAD_GROUP) '" + o.headGroup +
                      "' is not an instance group of " + c.source +
                      (near.empty() ? "" : "; did you mean '" + near + "'?") +
                      " groups are: " + c.groupNames() +
                      "; leave it unset for the default head (the GPU group, else the first host)");
  }
  o.headGroup.clear();
  return missing;
}

// `troupe sim --pin`: run on the CPU set TROUPE_CPUS names. Before any thread starts, so every
// thread inherits it.
void pinFromEnvironment() {
  const char* text = getenv("TROUPE_CPUS");
  if (text == nullptr || *text == '\0') return;
  auto cpus = parseCpuList(text, "TROUPE_CPUS");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (auto c : cpus) {
    if (c >= CPU_SETSIZE)
      throw ConfigError("TROUPE_CPUS '" + std::string(text) + "': no CPU " + std::to_string(c));
    CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    throw ConfigError("TROUPE_CPUS '" + std::string(text) + "': cannot run on those CPUs (" +
                      strerror(errno) + "); this machine allows " + allowedCpus());
  }
  // Libraries start threads before main() (OpenBLAS's pool, for one): pin those too, or they run
  // on CPUs this instance does not have.
  for (auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    pid_t tid = std::stoi(task.path().filename().string());
    sched_setaffinity(tid, sizeof(set), &set);
  }
}

// The head writes --trace's file at the end of the job: refuse one it cannot write now, before
// the job runs, rather than lose the trace then. Every instance gets the same --trace, so every
// one checks its folder: all of them stop at once instead of waiting for a head that has exited.
void checkTraceFile(const std::string& path, bool isHead) {
  if (path.empty()) return;
  auto folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  bool ok;
  if (isHead) {
    FILE* f = fopen(path.c_str(), "w");
    ok = f != nullptr;
    if (ok) fclose(f);
  } else {
    ok = access(folder.c_str(), W_OK) == 0;
  }
  if (!ok) {
    throw ConfigError("--trace (TROUPE_TRACE) '" + path + "': cannot write it (" + strerror(errno) +
                      "); give a file in a folder that exists and is writable");
  }
}

// The end of the process, and on SageMaker its outcome file.
class Outcome {
 public:
  void setOutputDir(std::string dir) {
    // Room for the outcome file now, while the disk has it (sagemaker.h).
    if (dir != outputDir_) reserveOutcomeSpace(dir);
    outputDir_ = std::move(dir);
  }
  void setWho(std::string who) { who_ = std::move(who); }
  const std::string& who() const { return who_; }

  // A process started again that never reached the head: the host's outcome is its predecessor's
  // (docs/exit-codes.md), so that one's output/failure stays as it is. So too for a process the
  // head refused because another process of this host is in the job: the outcome is that one's.
  void keepPrevious(std::string why) { keepPrevious_ = std::move(why); }

  [[noreturn]] void end(int code, const std::string& reason) {
    if (!keepPrevious_.empty() && code != OK) {
      fprintf(stderr, "troupe: %s\n", keepPrevious_.c_str());
    } else if (!outputDir_.empty()) {
      bool ok = code == OK
                    ? writeSuccessFile(outputDir_, reason.empty() ? "the job succeeded" : reason)
                    : writeFailureFile(outputDir_, reason,
                                       "exit code " + std::to_string(code) + " (" +
                                           exitCodeName(code) + ") on " + who_);
      if (!ok) {
        fprintf(stderr, "troupe: cannot write %s/%s\n", outputDir_.c_str(),
                code == OK ? "success" : "failure");
      }
    }
    endProcess(code);
  }

 private:
  std::string outputDir_;  // empty: not under SageMaker
  std::string keepPrevious_;  // why this process leaves the host's outcome files alone
  std::string who_;
};

// What this node reports (troupe/node_size.h): its size from the machine under the instance
// type's ceiling, its labels and resources from the cluster file under the flags.
NodeInfo::Size describeThisNode(const ClusterConfig& c, const RunOptions& o) {
  auto& group = c.groupOf(c.currentHost);
  auto d = describeNode(c.currentInstanceType, group.labels, group.resources,
                        NodeFlags{{o.vcpus, o.gpus, o.memoryBytes}, o.labels, o.resources},
                        probeMachine());
  for (auto& note : d.size.notes) spdlog::warn("{}", note);
  return {static_cast<uint32_t>(d.size.vcpus.value), static_cast<uint32_t>(d.size.gpus.value),
          d.size.memoryBytes.value, d.labels, d.resources};
}

}  // namespace


// A node moves batches of tens of MB. glibc serves allocations from 128 KiB up with mmap() and
// unmaps them on free(), so every batch message would fault in fresh zeroed pages, on the sending
// side (Cap'n Proto builds each message in a new allocation) and for small-batch copies alike:
// a third of the producer's CPU per MB in bench_stream (docs/benchmarks.md, "Streaming
// batches"). Serving them from the heap, and not trimming it until 256 MiB are free, lets freed
// batch memory be reused as it is. 32 MiB is the largest threshold glibc accepts; larger
// allocations stay mmap()ed. Received messages of 256 KiB and up use their own pool
// (message_stream.h).
namespace {
void keepLargeAllocations() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}
}  // namespace

int run(int argc, char* argv[], Registry& registry, DriverFunction driver, RunOptions options) {
  // Links hold_stops_entry.cpp (the stop signals held from the program's first instruction) into
  // every program that calls run(), unless the program defines this itself (a Python module).
  static_cast<void>(*static_cast<const volatile bool*>(&detail::kStopsHeldFromStart));
  keepLargeAllocations();
  // The app's stdout a line at a time, as a terminal would have it: under troupe sim, SageMaker
  // or Slurm it is a pipe, and fully buffered printf lines would come after the log lines
  // (stderr, unbuffered) written after them, or at exit.
  fflush(stdout);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // Under `troupe sim`: die with the simulator even if it is SIGKILLed. The variable names the
  // process that started this one (troupe sim, or deploy/sagemaker/train, which names itself), or
  // an ancestor of it: with a program between that does not (SageMaker's sagemaker-training
  // toolkit as the instance's entry, running the script), this process dies with that program.
  // Gone before this line (the parent differs and the named process no longer exists): the
  // simulator was killed while this process started.
  if (const char* parent = getenv("TROUPE_DIE_WITH_PARENT")) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const long named = atol(parent);
    const bool gone = named <= 0 || (kill(static_cast<pid_t>(named), 0) != 0 && errno == ESRCH);
    if (getppid() != named && gone) {
      fprintf(stderr, "troupe: the process that started this job's instance (pid %s) is gone; "
                      "exiting\n", parent);
      _exit(INTERRUPTED);
    }
  }

  Outcome outcome;
  outcome.setWho(localHostName());
  if (smRootGiven()) outcome.setOutputDir(SageMakerEnv::defaultRoot() + "/output");
  Parsed parsed;
  Loaded loaded;
  bool isHead = false;
  std::optional<std::string> headGroupWarning;
  SageMakerEnv sagemaker = SageMakerEnv::inactive();
  try {
    parsed = parseOptions(argc, argv, options);
    if (!registry.problem().empty()) throw ConfigError(registry.problem());
    if (underSageMaker(options)) outcome.setOutputDir(SageMakerEnv::defaultRoot() + "/output");
    pinFromEnvironment();
    loaded = loadCluster(options);
    auto& c = loaded.config;
    outcome.setWho(c.currentHost + " (" + c.currentGroup + ")");
    sagemaker = underSageMaker(options) ? SageMakerEnv::load(SageMakerEnv::defaultRoot())
                                        : SageMakerEnv::inactive();
    headGroupWarning = resolveHeadGroup(c, options, parsed.headGroupGiven);
    parseStartWith(options.startWith, c);  // checked on every node: each fails at once
    isHead = c.currentHost == c.headHost(options.headGroup);
    checkTraceFile(options.traceFile, isHead);
  } catch (const ConfigError& e) {
    // Also when the options did not parse: the rule for a SageMaker root needs none of them.
    if (underSageMaker(options)) outcome.setOutputDir(SageMakerEnv::defaultRoot() + "/output");
    fprintf(stderr, "troupe: configuration error: %s\n", e.what());
    outcome.end(CONFIG_ERROR, "configuration error on " + outcome.who() + ": " + e.what());
  }
  if (const char* roleFile = getenv("TROUPE_ROLE_FILE")) {
    // For a supervisor (troupe sim) that must know which process is the head.
    FILE* f = fopen(roleFile, "w");
    if (f != nullptr) {
      fputs(isHead ? "head\n" : "worker\n", f);
      fclose(f);
    }
  }
  auto& config = loaded.config;
  auto& appArgs = parsed.appArgs;
  setupLogging(config.currentHost + " " + config.currentGroup + (isHead ? " head" : " worker"),
               options.logLevel);
  if (headGroupWarning) spdlog::warn("{}", *headGroupWarning);
  if (getenv("TROUPE_CPUS") != nullptr) spdlog::info("pinned to CPUs {}", allowedCpus());
  listenOnInterface(loaded);
  NodeInfo::Size size;
  try {
    size = describeThisNode(config, options);
  } catch (const ConfigError& e) {
    spdlog::error("configuration error: {}", e.what());
    outcome.end(CONFIG_ERROR, "configuration error on " + outcome.who() + ": " + e.what());
  }
  // Before the event loop and its pool start: this thread is the "event loop" row.
  if (!options.traceFile.empty()) trace::enable(options.traceBufferSpans);

  try {
    EventLoop loop(size.vcpus);
    NodeRuntime node(loop, registry, options, config, loaded.hosts, size, kj::mv(sagemaker));
    node.listen();

    kj::Own<Head> head;
    kj::Own<Worker> worker;
    if (node.info().isHead()) {
      head = kj::heap<Head>(node, kj::mv(driver), appArgs);
      node.setHead(*head);
      node.setCluster(kj::heap<ClusterSession>(*head, nullptr));
      node.tasks().add(head->run());
    } else {
      spdlog::info("worker; head is {} at {}", node.headHost(),
                   node.hosts().addressOf(node.headHost()));
      worker = kj::heap<Worker>(node);
      worker->start();
    }
    node.whenExitRequested().wait(loop.waitScope());
    // Let replies already queued (Node.exit's return, for one) reach the wire.
    loop.timer().afterDelay(100 * kj::MILLISECONDS).wait(loop.waitScope());
    if (worker) worker->logControlPath();
    // The control threads end first: nothing runs beside the exit but the pool.
    if (worker) worker->stopControl();
    if (head) head->stopControl();
    bool duplicate = node.exitReason().find(kTwoProcesses) != std::string::npos;
    if (node.exitCode() == JOIN_FAILED && duplicate) {
      outcome.keepPrevious("another process of this host is in the job; its output/failure is "
                           "the host's, not this one's");
    } else if (node.exitCode() == JOIN_FAILED && node.info().incarnation() > 0) {
      outcome.keepPrevious("this process did not rejoin the job; the output/failure of the "
                           "process before it stands");
    }
    outcome.end(node.exitCode(), node.exitReason());
  } catch (const ConfigError& e) {
    spdlog::error("configuration error: {}", e.what());
    outcome.end(CONFIG_ERROR, "configuration error on " + outcome.who() + ": " + e.what());
  } catch (const kj::Exception& e) {
    spdlog::critical("internal error: {}", e.getDescription().cStr());
    outcome.end(INTERNAL_ERROR,
                "internal error on " + outcome.who() + ": " + e.getDescription().cStr());
  } catch (const std::exception& e) {
    spdlog::critical("internal error: {}", e.what());
    outcome.end(INTERNAL_ERROR, "internal error on " + outcome.who() + ": " + e.what());
  }
}

}  // namespace troupe
