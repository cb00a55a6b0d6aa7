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

#include "sim_instances.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sim {

namespace {

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
  // A stop (SIGTERM, SIGINT) is never undone by a restart, even one that killed the process
  // before it took the signals (its first moments): as `train` and troupe-node.
  if (signal == SIGTERM || signal == SIGINT) return false;
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
    // The default budget is a weight: a quota's debt freezes a whole instance (cpu_quota.h).
    bool defaultBudget = in.cpuScale > 0 && spec_.cpuScale == JobSpec::kAutoCpuScale;
    in.cgroup = std::make_unique<CpuQuotaCgroup>(name, in.cpuQuota, !defaultBudget);
    if (in.cgroup->why().empty()) continue;
    if (defaultBudget) {
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
    // Outermost, so that the wrappers above (a shell, ip netns exec) start with the stops held
    // too: only this program's own loading (milliseconds) is left for a stop to kill.
    if (!spec_.self.empty()) opts.args.insert(opts.args.begin(), {spec_.self, kExecHeld});
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
    std::string budget;  // a weight alone (the default budget), or a quota
    if (in.cpuQuota > 0) {
      budget = (in.cgroup && !in.cgroup->capped() ? " cpu-share=" : " cpu-quota=") +
               formatCpus(in.cpuQuota);
    }
    printf("troupe sim: %-8s %-12s %-16s %-16s pid=%d%s%s%s%s\n", in.host.c_str(), in.group.c_str(),
           in.instanceType.c_str(), in.address.c_str(), in.process->pid(),
           in.cpus.empty() ? "" : " cpus=", in.cpus.c_str(),
           budget.c_str(),
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
      bool mendable =
          !in.wasHead && !ended && !signalled_ && signals == 0 && restartsNode(e.status, e.signal);
      int code = codeOf(e);
      if (mendable && in.incarnation >= spec_.nodeRestarts && spec_.nodeRestarts > 0) {
        // As `train` and troupe-node say it: the host ends with this process's code.
        printf(
            "troupe sim: %s (%s) %s %d (%s); no restarts left (--node-restarts %u): this host "
            "ends %d\n",
            in.host.c_str(), in.group.c_str(), e.signal ? "was killed by signal" : "exited with",
            e.signal ? e.signal : code, codeName(code).c_str(), spec_.nodeRestarts, code);
      }
      if (!mendable || in.incarnation >= spec_.nodeRestarts) return e;
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

