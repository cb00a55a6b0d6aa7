// bench_pipeline's parts, one file each (main.cpp says what the bench measures and how):
//   common.cpp   small helpers: times, medians, CPU lists, /proc readings, the children's signals
//   probe.cpp    the cost probe: a child pinned to one CPU that measures the libraries directly
//   setups.cpp   one run of hetero_train under `troupe sim` in a setup, watched for unpinned threads
//   figures.cpp  runs summarised, the advisor's predictions, costs
//   sweep.cpp    --sweep-blur / --sweep-data-instances
//   main.cpp     the two-setup comparison, its table and JSON, and the options

#pragma once

#include <sched.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "advise.h"
#include "subprocess.h"
#include "troupe/dataset/fashion_mnist.h"

namespace bench_pipeline {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Options {
  // hetero_train's --augment preset, plus --blur: light with blur 99 is the figures of
  // docs/benchmarks.md's pipeline section; `make scaling` sweeps heavy (hetero_train's default).
  std::string augment = "light";
  int blur = 99;
  unsigned batchSize = 128;
  unsigned epochs = 1;
  uint64_t samples = 60000;
  unsigned prefetch = 4;
  unsigned perNode = 1;
  float lr = 0.05f;
  std::string device = "cpu";  // hetero_train's --device: the trainer's back end (cpu, cuda, auto)
  std::vector<unsigned> cpus;  // {dnn CPU, data CPU, ...}; default: those this process may use
  // Sweeps (--sweep-blur, --sweep-data-instances): one setup per (blur, data instances); the
  // advisor predicts each from the setup with the fewest data instances of the same blur.
  std::vector<int> sweepBlur;
  std::vector<unsigned> sweepData;
  double dataShare = 1;  // < 1: every data instance on the data CPU, each limited to this share
  int predictFrom = -1;  // the data-group size whose run the advisor predicts from; -1: the smallest
  unsigned rounds = 3;
  bool simUnpinned = false;
  int nice = 0;  // of every child (negative needs root); inherited by the instances  // start
                 // `troupe sim` unpinned, as it is usually run
  unsigned attempts = 2;  // per run, when an instance was lost and an actor restarted
  double timeoutSeconds = 600;
  double measureSeconds = 3;
  bool json = false;
  std::string jsonOut;  // also write the JSON object here
  std::string keep;  // keep logs and reports here
  std::string troupe = TROUPE_BINARY;
  std::string app = HETERO_TRAIN_BINARY;
  std::string dataDir = troupe::data::kDefaultFashionMnistDir;
  // Internal: the cost probe (a child of the bench). "pinned" or "late-pin".
  std::string probe;
};

// -- common.cpp

double secondsSince(Clock::time_point t);
double median(std::vector<double> v);
std::string cpuList(const cpu_set_t& set);
std::vector<unsigned> allowedCpus();
std::string tail(const std::string& text, size_t lines);
// The last `lines` lines of `text`.
std::map<unsigned, double> cpuBusySeconds();
// Busy seconds of each CPU so far (/proc/stat: everything but idle and iowait).
double loadAverage();

// -- Children: a process group each, reaped on every path.

extern volatile sig_atomic_t gSignal;  // SIGINT or SIGTERM the bench got
extern volatile pid_t gChild;          // the child it passes them on to
void onSignal(int sig);

struct Interrupted {
  int signal;
};

class Child {
  // One child process, stdout and stderr to `outPath`, in its own process group, SIGTERMed if the
  // bench dies (PR_SET_PDEATHSIG). The destructor stops and reaps it if it still runs.
 public:
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
        const std::string& outPath, int pinCpu = -1, int nice = 0)
      : outPath_(outPath) {
    troupe::subprocess::Spec spec;
    spec.argv = argv;
    spec.env = extraEnv;
    spec.dropTroupeEnv = true;
    spec.out = troupe::subprocess::Stream::file(outPath);
    spec.errToOut = true;
    spec.ownProcessGroup = true;
    spec.parentDeathSignal = SIGTERM;
    spec.pinCpu = pinCpu;
    spec.nice = nice;
    child_ = std::make_unique<troupe::subprocess::Child>(spec);
    gChild = child_->pid();
    if (gSignal) child_->signal(SIGTERM);
  }

  ~Child() { stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return child_->pid(); }

  // The exit code (128 + signal), or -1 after `timeoutSeconds`. Calls `tick` every ~100 ms.
  // Throws Interrupted (after reaping) when the bench got SIGINT or SIGTERM.
  int wait(double timeoutSeconds, const std::function<void()>& tick = {}) {
    auto start = Clock::now();
    for (;;) {
      // The signal first: onSignal() has already passed SIGTERM on, so the child may be gone.
      if (gSignal) {
        stop();
        throw Interrupted{gSignal};
      }
      if (child_->poll()) break;
      if (secondsSince(start) > timeoutSeconds) return -1;
      if (tick) tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (gChild == child_->pid()) gChild = 0;
    return *child_->poll();
  }

  // SIGTERM, up to 20 s for the graceful cascade, then SIGKILL to the whole process group.
  void stop() {
    child_->stop(std::chrono::seconds(20));
    if (gChild == child_->pid()) gChild = 0;
  }

  std::string output() const {
    std::ifstream in(outPath_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string outPath_;
  std::unique_ptr<troupe::subprocess::Child> child_;
};

// -- probe.cpp

json runProbe(const Options& o);
// In the child (--probe pinned or late-pin): the costs, one JSON object.
json probe(const Options& o, const std::string& kind, const fs::path& dir, const char* self);
// Starts that child pinned to the dnn CPU and reads its JSON.

// -- setups.cpp

struct Run {
  std::string setup;  // "homogeneous" or "heterogeneous"; in a sweep "blur B, N data"
  int blur = 0;
  unsigned dataCount = 0;  // data_group instances (0: homogeneous)
  unsigned round = 0, attempt = 0;
  bool restarted = false;  // an instance was lost and an actor restarted: not a valid sample
  double wallSeconds = 0;
  json report;
  json pinning;
  json cpus;  // per bench CPU: busy, used by the instances, used by other processes
};

std::string setupName(const Options& o, int blur, unsigned dataCount);
// "homogeneous" or "heterogeneous"; in a sweep "blur B, N data".
Run runSetup(const Options& o, int blur, unsigned dataCount, const fs::path& dir, unsigned round,
             unsigned attempt);
void runRounds(const Options& o, int blur, unsigned dataCount, const fs::path& dir,
               std::vector<Run>& runs, unsigned round);
// Runs one setup once (again, up to --attempts, when an instance was lost).

// -- figures.cpp

struct Summary {
  json best;  // the run with the lowest mean step time
  json report;  // its hetero_train report
  std::vector<double> steps;
};
Summary summarize(const std::vector<Run>& runs, const std::string& setup);
hetero_train::advise::Row predictSetup(const json& base, unsigned dataCount, double dataShare);
// The sizing advisor (deploy/advise/advise.h) on `base`, a report of one of this bench's runs,
// for `dataCount` data instances. The bench pins the dnn instance to one CPU and gives each data
// instance `dataShare` of one, so those are their vCPUs here, not their instance types'.
std::string fmtShare(double share);
double measuredCostPer1000(double stepMs, unsigned dataCount);
// What a setup's measured step costs per 1,000 steps at the instance table's prices.

// -- sweep.cpp

int runSweep(const Options& o, const fs::path& dir);

}  // namespace bench_pipeline
