// `troupe sim`: one run of the job — one process of the app per simulated instance, each with its
// own SageMaker-shaped root, until the head has exited and the others followed. sim.cpp parses the
// options and starts runs; with --restarts-on-interrupt it starts the job again after the
// simulator interrupted it, as SageMaker does after a managed spot reclaim.

#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "troupe/loop.h"

namespace sim {

// `troupe __exec-held APP ARGS...` (sim.cpp's main): execs APP with SIGTERM and SIGINT blocked,
// as the per-instance entry points start an instance's process; startProcess() starts each so.
inline constexpr const char* kExecHeld = "__exec-held";

struct GroupArg {
  std::string name;
  unsigned count = 1;
  std::string instanceType;
};

GroupArg parseGroup(const std::string& text);
// NAME=COUNT[:TYPE]. Throws std::invalid_argument saying what is wrong.

std::pair<std::string, std::string> splitPair(const std::string& text, char sep,
                                              const std::string& option, const char* shape);
// "KEY=VALUE" -> {KEY, VALUE}; throws std::invalid_argument naming `option` and `shape`.

struct JobSpec {
  // What every run of the job shares.
  std::vector<GroupArg> groups;
  nlohmann::json hyperparameters = nlohmann::json::object();
  std::vector<std::pair<std::string, std::filesystem::path>> channels;
  std::vector<std::string> envArgs, cpuArgs;
  std::vector<std::pair<std::string, double>> cpuQuotas;  // --cpu-quota: HOST_OR_GROUP, CPUs
  // --cpu-scale: CPUs of this machine per vCPU of an instance's type, each instance in a cgroup
  // limited to that many times its vCPUs. kAutoCpuScale: this machine's CPUs over the cluster's
  // vCPUs (at most 1), or none where cgroups cannot be made (a note says why); 0: none.
  static constexpr double kAutoCpuScale = -1;
  double cpuScale = kAutoCpuScale;
  bool pin = false, netns = false;
  std::string headGroup, tokenFile;
  unsigned graceMs = 10000, lingerMs = 15000;
  unsigned nodeRestarts = 2;  // --node-restarts: per host, as the per-instance entry point does
  std::vector<std::pair<std::string, unsigned>> startLate;  // --start-late HOST=MS
  // --start-late-after TEXT: the late starts' delays count from the first output line of any
  // instance that contains TEXT (a moment in training), not from the run's start.
  std::string startLateAfter;
  struct ScaleUp {
    std::string group;
    unsigned count = 0, afterMs = 0;
  };
  std::vector<ScaleUp> scaleUps;  // --scale-up GROUP=N@MS: new members, not in the description
  std::vector<std::string> app;
  std::string self;  // this program (/proc/self/exe), which starts each process (kExecHeld)
  std::filesystem::path checkpoints;  // empty: none; else every root's checkpoints/ links here
  std::filesystem::path traceFile;    // --trace: every instance's TROUPE_TRACE (the head writes it)
};

struct Interruption {
  // The simulator's own SIGTERM to every instance, as SageMaker stops a job when it reclaims
  // spot capacity: `delayMs` after the run starts, or after the first output line of any instance
  // that contains `after` when that is not empty. `hard`: SIGKILL instead (capacity lost without a
  // grace period).
  unsigned delayMs = 0;
  std::string after;
  bool hard = false;
};

bool restartsNode(int status, int signal);
// The per-instance entry point's rule (docs/lifecycle.md, "Membership"): a worker's process is
// started again when it was killed by a signal or exited HEAD_LOST, FENCED or INTERNAL_ERROR.

int finalCode(const std::vector<int>& codes);
// A host's outcome from its processes' codes (128 + signal when killed), first to last: the last
// one's, unless the last was a restart that never reached the head again (JOIN_FAILED): then the
// code of the one before it.

struct RunOutcome {
  int status = 0;            // the job's, as the cloud judges it: the head's exit code (128 +
                             // signal if killed), or when that is 0, the first host's final
                             // code that is not
  bool interrupted = false;  // the Interruption fired before the job ended
  bool signalled = false;    // the simulator itself got SIGTERM/SIGINT
  std::vector<std::pair<std::string, std::filesystem::path>> roots;  // host, its root
};

class Runs {
  // Starts runs of one job, one after another, on one event loop; forwards the simulator's
  // SIGTERM/SIGINT to the run in progress.
 public:
  Runs(troupe::EventLoop& loop, JobSpec spec, std::filesystem::path dir, unsigned seed);

  RunOutcome run(unsigned number, std::optional<Interruption> interruption);
  // Run `number` (1, 2, ...): roots under dir (run 1) or dir/run-<number>, host names dealt
  // again across groups (new capacity), fresh ports. Prints one line per instance and returns
  // once every instance has exited. Throws std::runtime_error for a set-up failure (--netns).

 private:
  troupe::EventLoop& loop_;
  JobSpec spec_;
  std::filesystem::path dir_;
  unsigned seed_;
  std::mt19937 rng_;
  std::function<void(int)> onSignal_;  // the run in progress's handler
  bool signalled_ = false;
};

}  // namespace sim
