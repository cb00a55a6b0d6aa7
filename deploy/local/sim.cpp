// `troupe sim`: a heterogeneous cluster as local processes on loopback. (The same tool's `env`
// prints what a node sees in a root; `status` asks a running job's head, status.h.)
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
// TROUPE_ROLE_FILE), also when other instances were lost on the way. The roots are temporary; what
// the instances wrote to model/ and output/data/ (SageMaker's model.tar.gz and output.tar.gz)
// stays in --out DIR or troupe-out/<app>-<time>/, printed at the end (outputs.h).
// SIGTERM or SIGINT starts the job's graceful cascade (the signal is forwarded to every instance);
// a second one, or a child that outlives the grace period, gets SIGKILL. Children die with the
// simulator even if it is SIGKILLed (PR_SET_PDEATHSIG, set by troupe::run).
//
// Managed spot training, locally: --checkpoints DIR is every instance's <root>/checkpoints and
// outlives the run (SageMaker syncs /opt/ml/checkpoints with checkpoint_s3_uri);
// --interrupt-after-ms or --interrupt-random-ms (seeded, printed) SIGTERMs every instance at that
// moment, as a spot reclaim does, and --restarts-on-interrupt N starts the job again on newly
// dealt instances, so interruption and resume run with one command. One run is sim_run.h.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <random>

#include "advise_cmd.h"
#include "env_cmd.h"
#include "cpu_quota.h"
#include "job_file.h"
#include "netns.h"
#include "outputs.h"
#include "sim_run.h"
#include "status_cmd.h"
#include "subprocess.h"
#include "troupe/app_settings.h"
#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/loop.h"
#include "troupe/node_size.h"
#include "troupe/sagemaker.h"
#include "troupe/secret.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Options {
  std::vector<std::string> groupArgs, envArgs, hpArgs, channelArgs, cpuArgs, cpuQuotaArgs, app,
      startLateArgs, scaleUpArgs;
  std::string cpuScale = "auto";
  unsigned nodeRestarts = 2;
  std::string headGroup, tokenFile, refusedToken, trace, checkpoints, interruptRandom,
      interruptWhen, out, startLateAfter;
  sim::EnvOptions envOptions;
  unsigned seed = 0, graceMs = 10000, lingerMs = 15000, interruptSeed = 0, restarts = 0;
  int64_t interruptAfterMs = -1;
  bool keep = false, pin = false, netns = false, interruptHard = false, env = false;
  sim::StatusOptions status;
  bool statusCommand = false;
  bool advise = false;
  AdviseOptions adviseOptions;
};

// Parses argv; a non-empty result is the exit code (help, or a parse error).
std::optional<int> parseOptions(int argc, char* argv[], Options& o) {
  CLI::App cli("troupe: a Ray-like actor runtime for heterogeneous clusters");
  cli.set_version_flag("--version", std::string("troupe ") + TROUPE_VERSION);
  cli.require_subcommand(1);
  auto* sim = cli.add_subcommand("sim", "run APP as a simulated heterogeneous cluster on loopback");
  auto* envCmd = sim::addEnvCommand(cli, o.envOptions);
  auto* statusCmd = sim::addStatusCommand(cli, o.status);
  auto* adviseCmd = cli.add_subcommand(
      "advise",
      "size the data group from a hetero_train --report: predicted step time, data wait and cost "
      "per 1,000 steps for each data-group instance type and count (docs/advisor.md)");
  addAdviseOptions(*adviseCmd, o.adviseOptions);
  sim->add_option("--group", o.groupArgs, "NAME=COUNT[:INSTANCE_TYPE], repeatable")
      ->default_str("data_group=2:ml.c5.xlarge dnn_group=1:ml.p3.2xlarge");
  sim->add_option("--head-group", o.headGroup, "the group whose first host is the head");
  sim->add_option("--token-file", o.tokenFile,
                  "a file only you can read holding the job secret (default: a fresh one)");
  sim->add_option("--token", o.refusedToken)->group("");  // refused below, with the reason
  sim->add_option("--seed", o.seed, "seed for dealing host names (default: random)");
  sim->add_option("--grace-ms", o.graceMs, "after a signal, how long instances get to exit");
  sim->add_option("--linger-ms", o.lingerMs,
                  "after the head exits, how long the others get before SIGTERM");
  sim->add_option("--trace", o.trace,
                  "every instance records spans; the head writes the merged timeline (Chrome "
                  "trace-event JSON, docs/tracing.md) to this file at the end of the job");
  sim->add_flag("--keep", o.keep, "keep the per-instance roots (printed at start)");
  sim->add_option("--out", o.out,
                  "where the job's outputs stay: every instance's model/ and output/data/ are "
                  "copied to DIR/model/ and DIR/output/ when it ends (default: "
                  "troupe-out/<app>-<UTC time>, made only when an instance wrote something)");
  sim->add_option("--env", o.envArgs,
                  "HOST_OR_GROUP:KEY=VALUE, an extra environment variable for some instances");
  sim->add_option("--hp", o.hpArgs,
                  "KEY=VALUE, a hyperparameter in every instance's hyperparameters.json");
  sim->add_option("--channel", o.channelArgs,
                  "NAME=PATH, an input channel: input/data/NAME links to PATH on every instance");
  sim->add_flag("--pin", o.pin,
                "pin each instance to its own CPUs, in proportion to its instance type's vCPUs");
  sim->add_option("--cpus", o.cpuArgs, "HOST_OR_GROUP=CPU_LIST, the CPUs of some instances");
  sim->add_option("--cpu-quota", o.cpuQuotaArgs,
                  "HOST_OR_GROUP=CPUS (e.g. data_group=0.25): each such instance in a cgroup of "
                  "its own limited to CPUS CPUs, to emulate instances smaller than a CPU (needs "
                  "root and a cgroup hierarchy with the cpu controller)");
  sim->add_option("--cpu-scale", o.cpuScale,
                  "auto, off or CPUS: every instance in a cgroup given its instance type's "
                  "vCPUs times CPUS CPUs of this machine, so the cluster has its types' CPU "
                  "ratios (auto: this machine's CPUs over the cluster's vCPUs, at most 1, as a "
                  "weight without a quota; a number: a quota; none, with a note, where cgroups "
                  "cannot be made). --cpus, --pin and --cpu-quota place an instance instead")
      ->capture_default_str();
  auto* membership = "Membership";
  sim->add_option("--node-restarts", o.nodeRestarts,
                  "start a worker's process again, as the per-instance entry point does, when it "
                  "is killed by a signal or exits HEAD_LOST, FENCED or INTERNAL_ERROR, up to this "
                  "many times per host; the new process rejoins the job (default 2)")
      ->check(CLI::Range(0u, 100u))
      ->group(membership);
  sim->add_option("--start-late", o.startLateArgs,
                  "HOST=MS or GROUP[:N]=MS: start that instance (or the group's first N "
                  "instances, all without N) MS milliseconds after the others (repeatable); with "
                  "the app's --start-with they join the running job")
      ->group(membership);
  sim->add_option("--start-late-after", o.startLateAfter,
                  "TEXT: the delays of --start-late and --scale-up count from the first output "
                  "line of any instance that contains TEXT (e.g. a step of training), not from "
                  "the start; an instance whose moment never comes is never started")
      ->group(membership);
  sim->add_option("--scale-up", o.scaleUpArgs,
                  "GROUP=N@MS: start N more instances of GROUP, hosts the cluster description "
                  "does not name, MS milliseconds after the others (repeatable): they join the "
                  "running job as new members of GROUP")
      ->group(membership);
  sim->add_flag("--netns", o.netns,
                "root only: each instance in its own network namespace, a host of its own");
  auto* spot = "Managed spot training";
  sim->add_option("--checkpoints", o.checkpoints,
                  "a folder that is every instance's <root>/checkpoints and outlives the run, as "
                  "SageMaker's checkpoint_s3_uri does (created if missing)")
      ->group(spot);
  sim->add_option("--interrupt-after-ms", o.interruptAfterMs,
                  "SIGTERM every instance this long after the start (or after "
                  "--interrupt-when), as a spot reclaim does")
      ->check(CLI::Range(int64_t(0), int64_t(86400000)))
      ->group(spot);
  sim->add_option("--interrupt-random-ms", o.interruptRandom,
                  "MIN:MAX: the same, at a moment drawn from --interrupt-seed (printed)")
      ->group(spot);
  sim->add_option("--interrupt-seed", o.interruptSeed, "(default: random, printed)")->group(spot);
  sim->add_option("--interrupt-when", o.interruptWhen,
                  "start the interruption's clock at the first output line containing this text")
      ->group(spot);
  sim->add_flag("--interrupt-hard", o.interruptHard,
                "SIGKILL instead of SIGTERM: the capacity is lost without a grace period")
      ->group(spot);
  sim->add_option("--restarts-on-interrupt", o.restarts,
                  "start the job again this many times after an interruption (the last run is "
                  "not interrupted)")
      ->check(CLI::Range(0u, 100u))
      ->group(spot);
  // Everything from the app's path on belongs to the app.
  sim->prefix_command();
  sim->footer("APP [ARGS...] follows the options, after an optional --");
  // The app starts after the first "--" (CLI11's prefix_command() trips over "--" after some
  // options), or else at the first argument that is not an option.
  int cliArgc = argc;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--") == 0) {
      o.app.assign(argv + i + 1, argv + argc);
      cliArgc = i;
      break;
    }
  }
  try {
    cli.parse(cliArgc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : troupe::CONFIG_ERROR;
  }
  o.env = envCmd->parsed();
  o.statusCommand = statusCmd->parsed();
  o.advise = adviseCmd->parsed();
  if (sim->parsed()) {
    // prefix_command() hands everything from the first argument it does not know on to the app:
    // before a "--" that is an unknown option (the app follows the "--"); without one, an
    // argument that starts with '-' is one too, never an app. Either way the options after it
    // would be dropped without a word.
    auto rest = sim->remaining();
    bool unknown = !rest.empty() && (cliArgc != argc || rest.front().rfind("-", 0) == 0);
    if (unknown) {
      std::vector<std::string> known;
      for (const auto* opt : sim->get_options()) {
        for (auto& name : opt->get_lnames()) known.push_back("--" + name);
      }
      auto near = troupe::nearestName(rest.front(), known);
      fprintf(stderr, "troupe sim: unknown option '%s'%s; options go before the app: troupe sim "
              "[OPTIONS] -- APP [ARGS...] (see troupe sim --help)\n", rest.front().c_str(),
              near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
      return troupe::CONFIG_ERROR;
    }
    if (cliArgc == argc) o.app = rest;
  }
  return std::nullopt;
}

// The job every run shares, from the options. Throws std::invalid_argument or ConfigError.
sim::JobSpec jobSpec(Options& o) {
  sim::JobSpec spec;
  if (!o.refusedToken.empty()) troupe::refuseSecretArgument("--token");
  if (!o.tokenFile.empty()) {
    troupe::readSecretFile(o.tokenFile);  // its errors now, not once per instance
    spec.tokenFile = fs::absolute(o.tokenFile).string();
  }
  if (o.app.empty()) {
    throw std::invalid_argument("no app given; usage: troupe sim [OPTIONS] -- APP [ARGS...]");
  }
  if (o.groupArgs.empty()) o.groupArgs = {"data_group=2:ml.c5.xlarge", "dnn_group=1:ml.p3.2xlarge"};
  for (auto& g : o.groupArgs) {
    auto group = sim::parseGroup(g);
    for (auto& earlier : spec.groups) {
      if (earlier.name == group.name) {
        throw std::invalid_argument("--group '" + g + "': the group '" + group.name +
                                    "' is already given; give each group once, with its whole "
                                    "COUNT");
      }
    }
    spec.groups.push_back(group);
  }
  for (auto& e : o.envArgs) {
    auto colon = e.find(':');
    if (colon == std::string::npos || e.find('=', colon) == std::string::npos) {
      throw std::invalid_argument("--env '" + e + "': expected HOST_OR_GROUP:KEY=VALUE");
    }
  }
  for (auto& h : o.hpArgs) {
    auto [key, value] = sim::splitPair(h, '=', "--hp", "KEY=VALUE");
    spec.hyperparameters[key] = value;  // SageMaker passes every value as a string
  }
  for (auto& c : o.channelArgs) {
    auto [name, path] = sim::splitPair(c, '=', "--channel", "NAME=PATH");
    if (name.find('/') != std::string::npos || !fs::exists(path)) {
      throw std::invalid_argument(
          "--channel '" + c + "': " +
          (fs::exists(path) ? "NAME must not contain '/'" : "PATH '" + path + "' does not exist"));
    }
    spec.channels.emplace_back(name, fs::absolute(path));
  }
  if (o.netns) {
    auto why = sim::NetnsLab::unavailableReason();
    if (!why.empty()) {
      throw std::invalid_argument("--netns is not available: " + why +
                                  "; run without --netns (loopback)");
    }
  }
  // A bare name is looked up in PATH, as a shell does (`-- python train.py` in a venv).
  if (o.app[0].find('/') == std::string::npos) {
    auto found = troupe::subprocess::inPath(o.app[0]);
    if (found != o.app[0]) o.app[0] = fs::absolute(found).string();
  }
  if (access(o.app[0].c_str(), X_OK) != 0) {
    throw std::invalid_argument("app '" + o.app[0] + "' is not an executable file" +
                                (o.app[0].find('/') == std::string::npos ? " in PATH" : "") +
                                "; build it first, or give its path");
  }
  if (!o.out.empty() && fs::exists(o.out) && !fs::is_directory(o.out)) {
    throw std::invalid_argument("--out '" + o.out + "' is a file; give a folder (made if missing)");
  }
  if (!o.checkpoints.empty()) {
    spec.checkpoints = fs::absolute(o.checkpoints);
    std::error_code ec;
    fs::create_directories(spec.checkpoints, ec);
    if (!fs::is_directory(spec.checkpoints)) {
      throw std::invalid_argument("--checkpoints '" + o.checkpoints +
                                  "' is not a folder and cannot be made one");
    }
  }
  spec.envArgs = o.envArgs;
  spec.cpuArgs = o.cpuArgs;
  for (auto& q : o.cpuQuotaArgs) {
    auto [who, text] = sim::splitPair(q, '=', "--cpu-quota", "HOST_OR_GROUP=CPUS");
    char* end = nullptr;
    double cpus = strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(cpus >= 0.01) || cpus > 1024) {
      throw std::invalid_argument("--cpu-quota '" + q +
                                  "': CPUS must be a number of CPUs from 0.01 to 1024, e.g. "
                                  "data_group=0.25");
    }
    spec.cpuQuotas.emplace_back(who, cpus);
  }
  if (o.cpuScale == "off") {
    spec.cpuScale = 0;
  } else if (o.cpuScale != "auto") {
    char* end = nullptr;
    double scale = strtod(o.cpuScale.c_str(), &end);
    if (o.cpuScale.empty() || *end != '\0' || !(scale >= 0.001) || scale > 64) {
      throw std::invalid_argument("--cpu-scale '" + o.cpuScale +
                                  "': give auto, off, or the CPUs of this machine per vCPU, a "
                                  "number from 0.001 to 64 (e.g. 0.125)");
    }
    spec.cpuScale = scale;
  }
  spec.pin = o.pin;
  spec.netns = o.netns;
  spec.headGroup = o.headGroup;
  if (!o.trace.empty()) spec.traceFile = fs::absolute(o.trace);
  spec.graceMs = o.graceMs;
  spec.lingerMs = o.lingerMs;
  spec.nodeRestarts = o.nodeRestarts;
  for (auto& item : o.startLateArgs) {
    auto [host, text] = sim::splitPair(item, '=', "--start-late", "HOST=MS or GROUP[:N]=MS");
    char* end = nullptr;
    unsigned long ms = strtoul(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || ms > 3600000) {
      throw std::invalid_argument("--start-late '" + item +
                                  "': MS must be milliseconds from 0 to 3600000, e.g. algo-2=8000");
    }
    unsigned total = 0;
    for (auto& g : spec.groups) total += g.count;
    auto colon = host.find(':');
    auto name = host.substr(0, colon);
    const sim::GroupArg* group = nullptr;
    for (auto& g : spec.groups) {
      if (g.name == name) group = &g;
    }
    if (group != nullptr && colon != std::string::npos) {
      auto count = host.substr(colon + 1);
      unsigned long n = strtoul(count.c_str(), &end, 10);
      if (count.empty() || *end != '\0' || n < 1 || n > group->count) {
        throw std::invalid_argument("--start-late '" + item + "': N must be a number from 1 to " +
                                    std::to_string(group->count) + " (the instances of group '" +
                                    name + "')");
      }
    } else if (group == nullptr) {
      auto n = host.rfind("algo-", 0) == 0 ? strtoul(host.c_str() + 5, &end, 10) : 0;
      if (n < 1 || n > total || *end != '\0') {
        throw std::invalid_argument("--start-late '" + item + "': no host or group '" + host +
                                    "' in this cluster; its hosts are algo-1 to algo-" +
                                    std::to_string(total) + " (dealt across groups by --seed)");
      }
    }
    spec.startLate.emplace_back(host, static_cast<unsigned>(ms));
  }
  spec.startLateAfter = o.startLateAfter;
  for (auto& item : o.scaleUpArgs) {
    auto [group, rest] = sim::splitPair(item, '=', "--scale-up", "GROUP=N@MS");
    auto at = rest.find('@');
    char* end = nullptr;
    auto count = rest.substr(0, at);  // strtoul's `end` points into it
    unsigned long n = strtoul(count.c_str(), &end, 10);
    bool countOk = at != std::string::npos && at > 0 && *end == '\0' && n >= 1 && n <= 64;
    unsigned long ms = countOk ? strtoul(rest.c_str() + at + 1, &end, 10) : 0;
    if (!countOk || at + 1 == rest.size() || *end != '\0' || ms > 3600000) {
      throw std::invalid_argument("--scale-up '" + item +
                                  "': expected GROUP=N@MS, N from 1 to 64 instances and MS "
                                  "milliseconds from 0 to 3600000, e.g. data_group=1@5000");
    }
    bool known = false;
    for (auto& g : spec.groups) known = known || g.name == group;
    if (!known) {
      throw std::invalid_argument("--scale-up '" + item + "': no group '" + group +
                                  "' in this cluster; a new member joins a group of the job "
                                  "(--group)");
    }
    spec.scaleUps.push_back({group, static_cast<unsigned>(n), static_cast<unsigned>(ms)});
  }
  // --env names a group or a host of this cluster (its own or a scaled-up one): a typo would
  // leave the variable unset on every instance, silently.
  unsigned hosts = 0;
  std::string groups;
  for (auto& g : spec.groups) {
    hosts += g.count;
    groups += (groups.empty() ? "" : ", ") + g.name;
  }
  for (auto& u : spec.scaleUps) hosts += u.count;
  for (auto& e : o.envArgs) {
    auto who = e.substr(0, e.find(':'));
    bool known = false;
    for (auto& g : spec.groups) known = known || g.name == who;
    if (!known && who.rfind("algo-", 0) == 0) {
      char* end = nullptr;
      unsigned long n = strtoul(who.c_str() + 5, &end, 10);
      known = who.size() > 5 && *end == '\0' && n >= 1 && n <= hosts;
    }
    if (!known) {
      throw std::invalid_argument("--env '" + e + "': no host or group '" + who +
                                  "' in this cluster; name a group (" + groups +
                                  ") or a host, algo-1 to algo-" + std::to_string(hosts));
    }
  }
  spec.app = o.app;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) spec.self.assign(self, size_t(n));
  return spec;
}

// Copies the last run's model/ and output/data/ into the output folder and says where they are.
// Copies the outputs; false (said on stderr, the partial copy removed) when they could not be
// kept: a job whose outputs are lost has failed, as on SageMaker when its upload fails.
bool keepOutputs(const Options& o, const sim::RunOutcome& outcome) {
  fs::path out = o.out.empty() ? sim::defaultOutDir(o.app[0]) : fs::path(o.out);
  try {
    auto kept = sim::keepOutputs(outcome.roots, out);
    if (kept.empty()) {
      printf("troupe sim: no outputs (no instance wrote to its model/ or output/data/)\n");
    } else {
      std::string list;
      for (auto& f : kept) list += (list.empty() ? "" : ", ") + f.string();
      printf("troupe sim: outputs in %s/: %s\n", out.c_str(), list.c_str());
    }
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    for (auto folder : {"model", "output"}) fs::remove_all(out / folder, ec);
    fprintf(stderr,
            "troupe sim: the outputs could not be kept in %s: %s; the partial copy is removed "
            "(the instances' own folders are gone too: run the job again with --out on a disk "
            "with room, or --keep)\n",
            out.c_str(), e.what());
    fflush(stdout);
    return false;
  }
  fflush(stdout);
  return true;
}

// When each run is interrupted: nothing, or a moment (fixed, or drawn from the seed).
class InterruptPlan {
 public:
  explicit InterruptPlan(const Options& o) : o_(o) {
    bool random = !o.interruptRandom.empty();
    if (random && o.interruptAfterMs >= 0) {
      throw std::invalid_argument("--interrupt-after-ms and --interrupt-random-ms: give one");
    }
    if (random) {
      auto [lo, hi] = sim::splitPair(o.interruptRandom, ':', "--interrupt-random-ms", "MIN:MAX");
      // Whole milliseconds up to a day, digits only: stoul would take "-1" as 2^64-1 (and the
      // draw below then divided by zero) and drop what follows the digits ("5x").
      auto ms = [&](const std::string& text) {
        bool digits = !text.empty() && text.size() <= 8 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return isdigit(c); });
        if (!digits || std::stoul(text) > kMaxInterruptMs) {
          throw std::invalid_argument("--interrupt-random-ms '" + o.interruptRandom + "': '" +
                                      text + "' is not a number of milliseconds from 0 to " +
                                      std::to_string(kMaxInterruptMs) + " (a day); use MIN:MAX");
        }
        return std::stoul(text);
      };
      min_ = ms(lo);
      max_ = ms(hi);
      if (min_ > max_) {
        throw std::invalid_argument("--interrupt-random-ms '" + o.interruptRandom +
                                    "': expected MIN:MAX, milliseconds, MIN <= MAX");
      }
      seed_ = o.interruptSeed ? o.interruptSeed : std::random_device()();
      rng_.seed(seed_);
    }
    enabled_ = random || o.interruptAfterMs >= 0;
    if (!enabled_ && (o.restarts > 0 || o.interruptHard || !o.interruptWhen.empty())) {
      throw std::invalid_argument(
          "--restarts-on-interrupt, --interrupt-hard and --interrupt-when need "
          "--interrupt-after-ms or --interrupt-random-ms");
    }
  }

  // The interruption of run `number`, printed; none for the last one a restart may start.
  std::optional<sim::Interruption> next(unsigned number) {
    if (!enabled_ || number > o_.restarts + 1 || (o_.restarts > 0 && number == o_.restarts + 1)) {
      return std::nullopt;
    }
    sim::Interruption i;
    i.after = o_.interruptWhen;
    i.hard = o_.interruptHard;
    // mt19937's output is the same everywhere (its distributions are not): a seed means one
    // moment on every machine.
    i.delayMs = o_.interruptAfterMs >= 0 ? unsigned(o_.interruptAfterMs)
                                         : unsigned(min_ + rng_() % (max_ - min_ + 1));
    printf("troupe sim: run %u will be interrupted %u ms after %s%s%s", number, i.delayMs,
           i.after.empty() ? "it starts" : "the first line containing '", i.after.c_str(),
           i.after.empty() ? "" : "'");
    if (o_.interruptAfterMs < 0) printf(" (--interrupt-seed %u)", seed_);
    printf("\n");
    return i;
  }

 private:
  static constexpr unsigned long kMaxInterruptMs = 86'400'000;
  const Options& o_;
  bool enabled_ = false;
  unsigned long min_ = 0, max_ = 0;
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

}  // namespace

int runSim(int argc, char* argv[]) {
  Options o;
  if (auto code = parseOptions(argc, argv, o)) return *code;
  if (o.env) return sim::runEnv(o.envOptions);
  if (o.statusCommand) return sim::runStatus(o.status);
  if (o.advise) return runAdvise(o.adviseOptions);
  sim::JobSpec spec;
  std::optional<InterruptPlan> plan;
  try {
    spec = jobSpec(o);
    plan.emplace(o);
  } catch (const std::exception& e) {
    fprintf(stderr, "troupe sim: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
  unsigned seed = o.seed ? o.seed : std::random_device()();

  // What simulators killed by SIGKILL left behind (their destructors never ran): their cgroups,
  // their secrets, and their folders unless they were --keep.
  sim::CpuQuotaCgroup::removeStale();
  sim::removeStaleFolders();
  auto dir = fs::temp_directory_path() / ("troupe-sim-" + std::to_string(getpid()));
  fs::create_directories(dir);
  if (o.keep) std::ofstream(dir / ".keep") << "--keep\n";
  struct RemoveDir {
    fs::path dir;
    bool keep;
    ~RemoveDir() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } removeDir{dir, o.keep};
  // The job's secret: in the simulator's folder, beside the roots and in none of them, as on
  // SageMaker (where it is not a file under /opt/ml an app could save with its model). Removed at
  // the end even with --keep. Every run of the job uses the same one.
  struct RemoveFile {
    fs::path file;
    ~RemoveFile() {
      std::error_code ec;
      if (!file.empty()) fs::remove(file, ec);
    }
  } removeSecret;
  if (spec.tokenFile.empty()) {
    try {
      spec.tokenFile = (dir / "secret").string();
      troupe::writeSecretFile(spec.tokenFile, troupe::randomToken());
      removeSecret.file = spec.tokenFile;
    } catch (const troupe::ConfigError& e) {
      fprintf(stderr, "troupe sim: %s\n", e.what());
      return troupe::CONFIG_ERROR;
    }
  }
  // The state file `troupe status` finds the job by (job_file.h): gone with the job, --keep or not.
  RemoveFile removeJobFile{dir / sim::kJobFileName};
  if (!spec.checkpoints.empty()) {
    printf(
        "troupe sim: checkpoints in %s (every instance's <root>/checkpoints; kept after the "
        "job)\n",
        spec.checkpoints.c_str());
  }

  troupe::EventLoop loop(1);
  sim::Runs runs(loop, spec, dir, seed);
  for (unsigned number = 1;; ++number) {
    sim::RunOutcome outcome;
    try {
      outcome = runs.run(number, plan->next(number));
    } catch (const std::exception& e) {
      fprintf(stderr, "troupe sim: %s\n", e.what());
      return troupe::CONFIG_ERROR;
    }
    // SageMaker starts a job again only when the reclaim cut it short.
    if (!outcome.interrupted || outcome.signalled || outcome.status == 0 || number > o.restarts) {
      bool kept = keepOutputs(o, outcome);
      // docs/exit-codes.md: the job's code, or 1 (JOB_FAILED) for a job that succeeded but
      // whose outputs were lost.
      if (!kept && outcome.status == 0) return troupe::JOB_FAILED;
      return outcome.status;
    }
    printf(
        "troupe sim: run %u ended with %d (%s) after the interruption; starting the job again "
        "on new instances (restart %u of %u)\n",
        number, outcome.status, troupe::exitCodeName(outcome.status), number, o.restarts);
    fflush(stdout);
  }
}

int main(int argc, char* argv[]) {
  if (argc >= 3 && strcmp(argv[1], sim::kExecHeld) == 0) {
    // An instance's process, as the per-instance entry points start it (deploy/sagemaker/train,
    // troupe-node): SIGTERM and SIGINT blocked across the exec, so that a stop in its first
    // moments (the dynamic linker's, a Python interpreter's) waits for troupe::run() to take it
    // rather than kill it (143) with no word said.
    troupe::blockStopSignalsForExec();  // one already recorded (preinit holds them) stays pending
    execvp(argv[2], argv + 2);
    fprintf(stderr, "troupe sim: cannot start %s: %s\n", argv[2], strerror(errno));
    return 127;
  }
  // troupe::run() is linked in (troupe env uses its functions) and holds SIGTERM and SIGINT for an
  // app's node; this tool is no app: the signals act as usual until `troupe sim` takes them.
  troupe::releaseStopSignals();
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
