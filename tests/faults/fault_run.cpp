#include "fault_run.h"

#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "inject.h"
#include "sim_lines.h"

namespace faults {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

Options Options::fromBuild() {
  Options o{TROUPE_BINARY, HETERO_TRAIN};
  if (const char* t = getenv("FAULT_TROUPE")) o.troupe = t;
  if (const char* a = getenv("FAULT_HETERO_TRAIN")) o.app = a;
  return o;
}

const InstanceEnd* Observation::head() const {
  for (auto& e : instances) {
    if (e.role == "head") return &e;
  }
  return nullptr;
}

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> command(const Case& c, uint64_t seed, const Options& o,
                                 const std::string& report) {
  // `make run`'s cluster, and hetero_train's default augmenters: one per vCPU, no spare room.
  std::vector<std::string> argv = {o.troupe, "sim", "--keep", "--seed",
                                   std::to_string(seed % 2147483647 + 1)};
  if (c.netns) argv.push_back("--netns");
  for (auto& g : c.setting.groups) argv.insert(argv.end(), {"--group", g});
  argv.insert(argv.end(), c.setting.simArgs.begin(), c.setting.simArgs.end());
  argv.insert(argv.end(),
              {"--", o.app, "--epochs", std::to_string(c.setting.epochs), "--train-samples",
               std::to_string(kSamples), "--progress-every", "0.2", "--report", report});
  argv.insert(argv.end(), c.setting.appArgs.begin(), c.setting.appArgs.end());
  return argv;
}

// Instances the sim leaves behind when it dies become this process's children, so their exit
// codes can be read and nothing is left unreaped.
void becomeSubreaper() {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
}

// Reaps `pid` if it is this process's child (orphaned by the sim) and has exited: its code.
std::optional<int> reapOrphan(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, WNOHANG) != pid) return std::nullopt;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string rootsDir(const std::string& output) {
  static const std::regex roots(R"(roots in (\S+))");
  std::smatch m;
  return std::regex_search(output, m, roots) ? m[1].str() : "";
}

// Busy processes, `perCore` for each CPU this process may run on: a machine whose CPUs are
// oversubscribed 3-4x, as an instance with an augmenter on every vCPU is. Killed with the object.
class Hogs {
 public:
  explicit Hogs(int perCore) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    for (int i = 0; i < perCore * cpus; ++i) {
      pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (volatile uint64_t n = 0;; n = n + 1) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Hogs() {
    for (auto pid : pids_) kill(pid, SIGKILL);
    for (auto pid : pids_) waitpid(pid, nullptr, 0);
  }
  size_t count() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

// The process, its roots and report, and (with --netns) its namespaces go on every path.
class Scene {
 public:
  Scene(const Case& c, uint64_t seed, const Options& o)
      : report_("/tmp/troupe-fault-" + std::to_string(getpid()) + "-" + std::to_string(seed) +
                ".json"),
        netns_(c.netns),
        hogs_(c.setting.hogsPerCore) {
    becomeSubreaper();
    run_.emplace(command(c, seed, o, report_));
    if (o.quiet) run_->quietReasons();
  }
  ~Scene() {
    auto instances = run_->instances();
    auto roots = rootsDir(run_->output());
    int simPid = run_->pid();
    run_.reset();  // SIGKILLs the sim and every instance still there
    for (auto& [host, i] : instances) {
      for (int tries = 0; tries < 100 && harness::processExists(i.pid); ++tries) {
        std::this_thread::sleep_for(10ms);
      }
      reapOrphan(i.pid);
    }
    std::error_code ec;
    if (!roots.empty()) fs::remove_all(roots, ec);
    fs::remove(report_, ec);
    if (netns_ && simPid > 0) removeNetnsLeftovers(simPid, instances.size());
  }
  harness::Run& run() { return *run_; }
  const std::string& report() const { return report_; }

 private:
  std::string report_;
  bool netns_;
  Hogs hogs_;  // declared before run_: the job ends first
  std::optional<harness::Run> run_;
};

Target targetOf(const Case& c, harness::Run& run, Rng& rng) {
  Target t;
  t.sim = t.simPid = run.pid();
  for (auto& [host, i] : run.instances()) {
    if (i.group == "dnn_group") {
      t.head = i;
    } else {
      t.data.push_back(i);
    }
  }
  if (c.role == Role::HEAD) t.victim = t.head;
  if (c.role == Role::DATA && !t.data.empty()) t.victim = t.data[rng() % t.data.size()];
  return t;
}

std::vector<InstanceEnd> endsOf(const Case& c, const Target& t) {
  std::vector<InstanceEnd> ends;
  ends.push_back({t.head, "head"});
  for (auto& d : t.data) {
    bool hit = c.role == Role::DATA && d.host == t.victim.host;
    ends.push_back({d, hit ? "victim" : "worker"});
  }
  return ends;
}

int longestBound(const Expect& e) {
  return std::max({e.withinS, e.head.withinS, e.victim.withinS, e.workers.withinS});
}

// Runs the plan's steps as they come due and notes when each process is gone, until every one
// is, or the longest bound has passed.
void watch(Observation& obs, harness::Run& run, Plan& plan, int limitS) {
  auto t0 = Clock::now();
  size_t next = 0;
  for (int tick = 0;; ++tick) {
    while (next < plan.actions.size() && Clock::now() - t0 >= plan.actions[next].at) {
      plan.actions[next++].run();
    }
    bool headRuns = false, anyRuns = false;
    for (auto& e : obs.instances) {
      // An orphan may be seen gone (a zombie) before it is handed to this process to reap.
      if (e.code < 0) {
        if (auto code = reapOrphan(e.instance.pid)) e.code = *code;
      }
      if (e.goneS) continue;
      if (e.code >= 0 || !harness::processExists(e.instance.pid)) {
        e.goneS = since(t0);
      } else {
        anyRuns = true;
        headRuns = headRuns || e.role == "head";
      }
    }
    if (!obs.simGoneS && run.wait(0ms) >= 0) obs.simGoneS = since(t0);
    // The linger line is read only now and then: the output grows with every progress line.
    if (headRuns && tick % 5 == 0 && run.output().find(sim::kLingerSigterm) != std::string::npos) {
      obs.simTermedLiveHead = true;
    }
    if (obs.simGoneS && !anyRuns) return;
    if (since(t0) > limitS + 0.5) return;
    std::this_thread::sleep_for(20ms);
  }
}

// The codes of instances the sim left to this process: the kernel hands an orphan over a little
// after its parent died, so it may have been seen gone before it could be reaped.
void reapOrphans(Observation& obs) {
  auto deadline = Clock::now() + 1s;
  for (;;) {
    bool unknown = false;
    for (auto& e : obs.instances) {
      if (e.code < 0) {
        if (auto code = reapOrphan(e.instance.pid)) e.code = *code;
      }
      unknown = unknown || e.code < 0;
    }
    if (!unknown || Clock::now() > deadline) return;
    std::this_thread::sleep_for(10ms);
  }
}

// Each instance's end as the kernel reported it: reaped here (an orphan of a killed sim), or the
// wait status the sim wrote to <roots>/exit-status/<host> when it reaped it. Never inferred from
// what the sim prints: an instance with neither keeps code -1, which fails its case.
void readCodes(Observation& obs, harness::Run& run, const std::string& roots) {
  obs.simCode = run.wait(0ms);
  if (obs.simGoneS) reapOrphans(obs);
  for (auto& e : obs.instances) {
    if (e.code >= 0) {
      e.codeFrom = "reaped by the harness";
      continue;
    }
    if (roots.empty()) continue;
    auto path = fs::path(roots) / "exit-status" / e.instance.host;
    if (!fs::exists(path)) continue;
    try {
      auto j = nlohmann::json::parse(readFile(path));
      // Every process of the host, first to last (one unless troupe sim started it again).
      auto processes = j.contains("processes") ? j.at("processes") : nlohmann::json::array({j});
      pid_t first = processes.at(0).at("pid").get<pid_t>();
      if (first != e.instance.pid) {
        e.codeFrom = path.string() + " names pid " + std::to_string(first) + " first, not " +
                     std::to_string(e.instance.pid);
        continue;
      }
      std::vector<int> codes;
      for (auto& p : processes) {
        int sig = p.at("term_signal").get<int>();
        codes.push_back(sig ? 128 + sig : p.at("exit_status").get<int>());
      }
      // The host's final code, by docs/exit-codes.md's rule: its last process's, unless that one
      // was started again and never reached the head (5): then the one before it.
      e.code = codes.back();
      if (codes.size() > 1 && codes.back() == 5) e.code = codes[codes.size() - 2];
      e.processes = static_cast<int>(codes.size());
      e.codeFrom = path.string();
    } catch (const std::exception& ex) {
      e.codeFrom = path.string() + " does not parse: " + ex.what();
    }
  }
}

void readFailureFiles(Observation& obs, const std::string& roots) {
  if (roots.empty()) return;
  for (auto& e : obs.instances) {
    e.failure = readFile(fs::path(roots) / e.instance.host / "output" / "failure");
  }
}

void readReport(Observation& obs, const std::string& path) {
  if (!fs::exists(path)) {
    obs.reportError = "no report at " + path;
    return;
  }
  try {
    auto j = nlohmann::json::parse(readFile(path));
    std::vector<EpochCount> epochs;
    for (auto& e : j.at("epochs")) {
      epochs.push_back({e.at("samples").get<uint64_t>(), e.at("duplicates").get<uint64_t>(),
                        e.at("missing").get<uint64_t>(), e.at("digest").get<std::string>()});
    }
    obs.report = epochs;
  } catch (const std::exception& e) {
    obs.reportError = "the report " + path + " does not parse: " + e.what();
  }
}

// The last "step S/T" of a progress line: steps done and planned.
std::optional<std::pair<uint64_t, uint64_t>> lastStep(const std::string& out) {
  auto at = out.rfind(", step ");
  if (at == std::string::npos) return std::nullopt;
  unsigned long done = 0, planned = 0;
  if (sscanf(out.c_str() + at, ", step %lu/%lu", &done, &planned) != 2) return std::nullopt;
  return std::make_pair(uint64_t(done), uint64_t(planned));
}

// Waits until training has done a step drawn from the first `share` of its planned steps, then
// a little more (so that the fault may land inside a step): where a fault hurts. A fault before
// the first step tests formation, not training (issue 21: the old moment, 0-3 s after the first
// progress line, came before the first step in 3 of 4 runs). Notes the moment in words.
void waitForMoment(Observation& obs, harness::Run& run, Rng& rng, const Options& o,
                   Clock::time_point firstProgress) {
  std::optional<std::pair<uint64_t, uint64_t>> step;
  for (auto until = Clock::now() + 60s; Clock::now() < until; std::this_thread::sleep_for(20ms)) {
    if ((step = lastStep(run.output()))) break;
  }
  if (!step) {
    obs.moment = "no progress line with a step count";
    return;
  }
  uint64_t planned = step->second;
  uint64_t last = std::max<uint64_t>(1, uint64_t(o.maxStepShare * double(planned)));
  uint64_t target = std::uniform_int_distribution<uint64_t>(1, last)(rng);
  int extra = std::uniform_int_distribution<int>(0, o.maxExtraMs)(rng);
  uint64_t seen = step->first;
  for (auto until = Clock::now() + 120s; Clock::now() < until; std::this_thread::sleep_for(10ms)) {
    if (auto now = lastStep(run.output())) seen = now->first;
    if (seen >= target || run.wait(0ms) >= 0) break;
  }
  std::this_thread::sleep_for(Millis(extra));
  obs.momentMs = int(std::chrono::duration_cast<Millis>(Clock::now() - firstProgress).count());
  obs.moment = "after step " + std::to_string(target) + " of " + std::to_string(planned) +
               " (seen at step " + std::to_string(seen) + ", +" + std::to_string(extra) + " ms)";
}

// Waits for training to start; false (with the reason noted) when it does not.
bool started(Observation& obs, harness::Run& run) {
  if (run.waitFor("progress: epoch 1/", 120s)) return true;
  auto out = run.output();
  auto at = out.find("--netns is not available");
  if (at != std::string::npos) {
    obs.skipped = out.substr(at, out.find('\n', at) - at);
  } else {
    obs.notStarted = "no 'progress: epoch 1/' line within 120 s (sim exit " +
                     std::to_string(run.wait(0ms)) + ")";
  }
  return false;
}

// Whether `pid` catches or blocks SIGTERM (SigCgt or SigBlk in /proc/PID/status): its own code
// has run.
bool holdsSigterm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t mask = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SigCgt:", 0) == 0 || line.rfind("SigBlk:", 0) == 0) {
      mask |= std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
    }
  }
  return mask & (1ull << (SIGTERM - 1));
}

size_t instanceCount(const Case& c) {
  size_t n = 0;
  for (auto& g : c.setting.groups) n += std::stoul(g.substr(g.find('=') + 1));
  return n;
}

// Waits for the case's moment (Setting::when); false, with the reason noted, when the job never
// got there.
bool reachedMoment(Observation& obs, const Case& c, harness::Run& run, Rng& rng, const Options& o) {
  switch (c.setting.when) {
    case When::TRAINING: {
      if (!started(obs, run)) return false;
      waitForMoment(obs, run, rng, o, Clock::now());
      return true;
    }
    case When::STARTING: {
      auto until = Clock::now() + 30s;
      while (run.instances().size() < instanceCount(c) && Clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      if (run.instances().size() < instanceCount(c)) {
        obs.notStarted = "the sim did not start its " + std::to_string(instanceCount(c)) +
                         " instances within 30 s";
        return false;
      }
      // From the moment each instance's own code runs: before, the kernel's exec and the dynamic
      // linker load the app and its libraries (tens of ms on a loaded machine), a window no
      // code of the app can close (docs/exit-codes.md, "A stop from the first instruction": the
      // image's hold-signals does). Seen as SIGTERM caught or blocked in /proc/PID/status.
      auto codeUntil = Clock::now() + 10s;
      for (auto& [host, i] : run.instances()) {
        while (!holdsSigterm(i.pid) && Clock::now() < codeUntil) {
          std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
      }
      obs.momentMs = std::uniform_int_distribution<int>(0, c.setting.startMs)(rng);
      std::this_thread::sleep_for(Millis(obs.momentMs));
      obs.moment = std::to_string(obs.momentMs) + " ms after every instance's code ran";
      return true;
    }
    case When::FORMED: {
      if (!run.waitFor("cluster formed", 120s)) {
        obs.notStarted = "no 'cluster formed' line within 120 s";
        return false;
      }
      obs.momentMs = std::uniform_int_distribution<int>(0, 100)(rng);
      std::this_thread::sleep_for(Millis(obs.momentMs));
      obs.moment = std::to_string(obs.momentMs) + " ms after 'cluster formed'";
      return true;
    }
  }
  return false;
}

// Whether the fault came after the stage it is meant for: the run then proves nothing.
bool tooLate(const Case& c, const Target& t, const std::string& out) {
  switch (c.setting.when) {
    case When::TRAINING:
      return out.find("job finished") != std::string::npos;
    case When::STARTING:
      // Before the victim joined (the head's "algo-2 (data_group) joined from ..."), or before
      // the first training step when the victim is the head or everyone (the app's start).
      if (c.role == Role::DATA) {
        return out.find(t.victim.host + " (" + t.victim.group + ") joined") != std::string::npos;
      }
      if (auto step = lastStep(out)) return step->first > 0;
      return false;
    case When::FORMED: {
      auto step = lastStep(out);
      return step && step->first > 0;
    }
  }
  return false;
}

}  // namespace

Observation runCase(const Case& c, uint64_t seed, const Options& options) {
  Observation obs;
  obs.caseName = c.name;
  obs.seed = seed;
  auto start = Clock::now();
  if (c.netns) obs.skipped = netnsUnavailable();
  if (!obs.skipped.empty()) return obs;
  Rng rng(seed);
  Scene scene(c, seed, options);
  auto& run = scene.run();
  if (reachedMoment(obs, c, run, rng, options)) {
    auto target = targetOf(c, run, rng);
    obs.instances = endsOf(c, target);
    auto plan = c.inject(target, rng);
    obs.plan = plan.text;
    obs.late = tooLate(c, target, run.output());
    watch(obs, run, plan, longestBound(c.expect));
    obs.notInjected = *plan.failed;
    auto roots = rootsDir(run.output());
    readCodes(obs, run, roots);
    readFailureFiles(obs, roots);
    if (const auto* head = obs.head(); head && head->code == 0) readReport(obs, scene.report());
  }
  obs.output = run.output();
  obs.seconds = since(start);
  return obs;
}

}  // namespace faults
