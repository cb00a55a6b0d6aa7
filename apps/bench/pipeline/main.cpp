// bench_pipeline: the seeds' experiment in miniature (DESIGN.md section 1), in one run, with CPU
// pinning. hetero_train runs twice under `troupe sim` with the same settings and an augmentation
// heavy enough (a large --blur) to matter:
//   homogeneous    one dnn_group instance pinned to one CPU: the augmenter falls back to it
//                  (prefer("data_group")) and shares that CPU with the trainer;
//   heterogeneous  the same dnn_group instance on the same CPU, plus one data_group instance
//                  pinned to a second CPU, where the augmenter runs.
// Both runs use one augmenter per node (--augmenters-per-node 1): one augmenter in either setup,
// so both have the same single shard, the same batches in the same order and the same pipeline
// depth (--prefetch); only where the augmentation runs differs. (An augmenter works on one batch
// at a time, so one augmenter is exactly one core of augmentation: more than one per CPU would
// only add queueing.)
//
// Before the runs, a child process pinned to the dnn CPU (pinned before exec, so every thread of
// it, OpenBLAS's included, is on that one CPU) measures with the libraries directly, on one
// thread: augmentation throughput at the chosen blur, the trainer's step time with data always
// ready (its compute-only bound), and the per-epoch test evaluation. A second such child pins
// itself only after start-up, as `troupe::run` does in a node (TROUPE_CPUS), and measures the
// training step again: the difference is what threads started before the pinning take from the
// other CPU. During the runs the bench samples /proc for threads of each instance that are not
// confined to the instance's CPUs, and how much CPU time they use.
//
// Figures: both mean step times (hetero_train's --report: epoch wall time over steps), the
// speedup, the ideal speedup from the CPU ratio (2) and from the measured costs,
// (aug + train) / max(aug, train) per batch, the fraction of each ideal achieved, and the data-
// wait share of each run. Table by default, `--json` for one JSON object.
//
// Every child (the cost probes, `troupe sim`) runs in a process group of its own with
// PR_SET_PDEATHSIG, and is reaped on every path: on SIGINT/SIGTERM the bench forwards SIGTERM to
// it (the simulator cascades it to its instances), waits, then SIGKILLs the group.

#include <dlfcn.h>
#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "advise.h"
#include "subprocess.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/trainer/device.h"
#include "troupe/trainer/mlp.h"

namespace {

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

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string cpuList(const cpu_set_t& set) {
  std::string out;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    unsigned end = c;
    while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) ++end;
    if (!out.empty()) out += ",";
    out += end == c ? std::to_string(c) : std::to_string(c) + "-" + std::to_string(end);
    c = end;
  }
  return out;
}

std::vector<unsigned> allowedCpus() {
  cpu_set_t set;
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

// =============================================================================================
// The cost probe: runs in a child pinned to one CPU; prints one JSON object.

int openblasThreads() {
  using Get = int (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : -1;
}

void setOpenblasThreads(int n) {
  using Set = void (*)(int);
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set) set(n);
}

// Runs `fn(i)` for at least `seconds` and `minReps` times; returns each call's milliseconds.
template <typename Fn>
std::vector<double> timeReps(double seconds, size_t minReps, Fn&& fn) {
  std::vector<double> ms;
  auto start = Clock::now();
  for (size_t i = 0; i < minReps || secondsSince(start) < seconds; ++i) {
    auto t = Clock::now();
    fn(i);
    ms.push_back(1000 * secondsSince(t));
  }
  return ms;
}

json runProbe(const Options& o) {
  using namespace troupe;
  if (o.probe == "late-pin") {
    // As troupe::run does with TROUPE_CPUS: pin this thread once the libraries have started.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(o.cpus.at(0), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) throw std::runtime_error("sched_setaffinity");
  }
  omp_set_num_threads(1);  // as the trainer actor does
  const size_t B = o.batchSize;
  auto train = data::loadFashionMnist(o.dataDir, data::Split::kTrain);
  const size_t pixels = train.imageSize();
  const size_t span = std::min<size_t>(train.size(), std::max<size_t>(o.samples, B)) - B + 1;
  auto batchPixels = [&](size_t i) {
    return std::span<const uint8_t>(train.pixels).subspan((i * B) % span * pixels, B * pixels);
  };
  auto batchLabels = [&](size_t i) {
    return std::span<const uint8_t>(train.labels).subspan((i * B) % span, B);
  };
  json out;
  out["probe"] = o.probe;
  out["cpus"] = [] {
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    return cpuList(set);
  }();
  out["openblas_threads"] = openblasThreads();

  auto preset = [&] {
    return o.augment == "heavy" ? augment::AugmentConfig::heavy() : augment::AugmentConfig::light();
  };
  augment::AugmentConfig config = preset();
  std::vector<float> scratch(B * pixels);
  if (o.probe == "pinned") {
    config.blurKernel = o.blur;
    augment::Augmenter heavy(config);
    auto ms = timeReps(o.measureSeconds, 5, [&](size_t i) {
      heavy.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    double total = std::accumulate(ms.begin(), ms.end(), 0.0);
    out["augment_batch_ms"] = median(ms);
    out["augment_images_per_s"] = 1000.0 * B / median(ms);
    out["augment_images_per_s_mean"] = 1000.0 * B * ms.size() / total;
    config.blurKernel = 0;
    augment::Augmenter light(config);
    ms = timeReps(o.measureSeconds / 4, 5, [&](size_t i) {
      light.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    out["augment_images_per_s_no_blur"] = 1000.0 * B / median(ms);
  }

  // Inputs as the trainer gets them: augmented batches (16 of them, cycled).
  config.blurKernel = 0;
  augment::Augmenter light(config);
  std::vector<std::vector<float>> inputs;
  for (size_t i = 0; i < 16; ++i) {
    inputs.push_back(light.augment(batchPixels(i), train.rows, train.cols, i));
  }
  // The trainer's step on the back end the runs train on: a GPU's is wall time, launches included.
  std::shared_ptr<trainer::Device> device =
      trainer::selectDevice(o.device == "cuda"  ? trainer::DeviceKind::kCuda
                            : o.device == "cpu" ? trainer::DeviceKind::kCpu
                                                : trainer::DeviceKind::kAuto)
          .device;
  out["train_device"] = device->name();
  trainer::MlpConfig mlpConfig;
  mlpConfig.learningRate = o.lr;
  trainer::Mlp model(mlpConfig, device);
  auto step = [&](size_t i) { model.trainStep(inputs[i % 16], batchLabels(i % 16)); };
  for (size_t i = 0; i < 3; ++i) step(i);  // warm-up
  auto ms = timeReps(o.measureSeconds, 10, step);
  out["train_step_ms"] = median(ms);
  out["train_step_ms_mean"] = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  if (o.probe == "pinned") {
    // The same two costs while the other CPU augments too, as it does in the heterogeneous run:
    // two vCPUs of a VM may share a physical core (or its caches and memory bandwidth).
    std::atomic<bool> stop = false;
    std::atomic<uint64_t> otherBatches = 0;
    std::thread other([&] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.cpus.at(1), &set);
      sched_setaffinity(0, sizeof(set), &set);
      augment::AugmentConfig heavyConfig = preset();
      heavyConfig.blurKernel = o.blur;
      augment::Augmenter heavy(heavyConfig);
      std::vector<float> out(B * pixels);
      for (size_t i = 0; !stop; ++i, ++otherBatches) {
        heavy.augment(batchPixels(i), train.rows, train.cols, i, out);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    config.blurKernel = o.blur;
    augment::Augmenter heavy(config);
    auto busyAug = timeReps(o.measureSeconds, 5, [&](size_t i) {
      heavy.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    auto busyTrain = timeReps(o.measureSeconds, 10, step);
    stop = true;
    other.join();
    out["augment_batch_ms_other_cpu_busy"] = median(busyAug);
    out["train_step_ms_other_cpu_busy"] = median(busyTrain);
    auto test = data::loadFashionMnist(o.dataDir, data::Split::kTest);
    auto testInputs = augment::normalizeImages(test.pixels);
    auto evalMs = timeReps(0, 2, [&](size_t) { model.evaluate(testInputs, test.labels); });
    out["evaluate_ms"] = *std::min_element(evalMs.begin(), evalMs.end());
  } else if (openblasThreads() > 1) {
    // The same with one BLAS thread: what a properly pinned trainer gets.
    setOpenblasThreads(1);
    for (size_t i = 0; i < 3; ++i) step(i);
    auto one = timeReps(o.measureSeconds, 10, step);
    out["train_step_ms_one_blas_thread"] = median(one);
  }
  return out;
}

// =============================================================================================
// Children: a process group each, reaped on every path.

volatile sig_atomic_t gSignal = 0;
volatile pid_t gChild = 0;

void onSignal(int sig) {
  gSignal = sig;
  pid_t child = gChild;
  if (child > 0) kill(child, SIGTERM);  // `troupe sim` cascades it to its instances
}

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

std::string tail(const std::string& text, size_t lines) {
  if (text.empty()) return text;
  size_t at = text.size();
  for (size_t i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

// =============================================================================================
// Pinning check: threads of an instance not confined to its CPUs, and the CPU time they use.

class PinWatch {
 public:
  // Reads the simulator's "troupe sim: HOST GROUP TYPE ADDRESS pid=N cpus=LIST" lines.
  void scan(const std::string& simOutput) {
    static const std::regex line(R"(troupe sim: (\S+)\s+(\S+)\s+\S+\s+\S+\s+pid=(\d+) cpus=(\S+))");
    for (std::sregex_iterator it(simOutput.begin(), simOutput.end(), line), end; it != end; ++it) {
      pid_t pid = std::stoi((*it)[3]);
      if (!instances_.count(pid)) instances_[pid] = {(*it)[1], (*it)[2], (*it)[4]};
    }
  }

  void sample() {
    static const long ticks = sysconf(_SC_CLK_TCK);
    for (auto& [pid, in] : instances_) {
      fs::path dir = "/proc/" + std::to_string(pid) + "/task";
      std::error_code ec;
      for (auto& task : fs::directory_iterator(dir, ec)) {
        {
          // schedstat: nanoseconds on a CPU, nanoseconds runnable but waiting for one, slices.
          std::ifstream sched(task.path() / "schedstat");
          double run = 0, wait = 0;
          if (sched >> run >> wait) {
            auto& t = in.threads[std::stoi(task.path().filename())];
            t.first = std::max(t.first, run / 1e9);
            t.second = std::max(t.second, wait / 1e9);
          }
        }
        std::ifstream status(task.path() / "status");
        std::string l, allowed;
        while (std::getline(status, l)) {
          if (l.rfind("Cpus_allowed_list:", 0) == 0) {
            allowed = l.substr(l.find_first_not_of(" \t", 18));
          }
        }
        if (allowed.empty() || allowed == in.cpus) continue;
        std::ifstream statFile(task.path() / "stat");
        std::string stat;
        std::getline(statFile, stat);
        auto close = stat.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream fields(stat.substr(close + 2));
        std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
        if (f.size() < 37) continue;
        // After the comm field: f[11] utime, f[12] stime, f[36] the CPU it last ran on.
        double cpu = (std::stod(f[11]) + std::stod(f[12])) / ticks;
        auto& t = in.leaked[std::stoi(task.path().filename())];
        t.seconds = std::max(t.seconds, cpu);
        t.allowed = allowed;
        t.ranOn.insert(std::stoi(f[36]));
      }
    }
  }

  json report() const {
    json out = json::array();
    for (auto& [pid, in] : instances_) {
      double seconds = 0;
      std::set<int> ranOn;
      std::set<std::string> allowed;
      double onCpu = 0, runQueue = 0;
      for (auto& [tid, t] : in.threads) {
        onCpu += t.first;
        runQueue += t.second;
      }
      for (auto& [tid, t] : in.leaked) {
        seconds += t.seconds;
        ranOn.insert(t.ranOn.begin(), t.ranOn.end());
        allowed.insert(t.allowed);
      }
      out.push_back({{"host", in.host},
                     {"group", in.group},
                     {"cpus", in.cpus},
                     {"unpinned_threads", in.leaked.size()},
                     {"unpinned_allowed", allowed},
                     {"unpinned_cpu_seconds", seconds},
                     {"unpinned_ran_on", ranOn},
                     {"cpu_seconds", onCpu},
                     {"runqueue_wait_seconds", runQueue}});
    }
    return out;
  }

 private:
  struct Leak {
    double seconds = 0;
    std::string allowed;
    std::set<int> ranOn;
  };
  struct Instance {
    std::string host, group, cpus;
    std::map<int, Leak> leaked;
    std::map<int, std::pair<double, double>> threads;  // on a CPU, waiting for one (seconds)
  };
  std::map<pid_t, Instance> instances_;
};

// Busy seconds of each CPU so far (/proc/stat: everything but idle and iowait).
std::map<unsigned, double> cpuBusySeconds() {
  static const long ticks = sysconf(_SC_CLK_TCK);
  std::map<unsigned, double> busy;
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !isdigit(line[3])) continue;
    std::istringstream in(line.substr(3));
    unsigned cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    busy[cpu] = (user + nice + system + irq + softirq + steal) / ticks;
  }
  return busy;
}

// =============================================================================================
// The two setups.

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

std::vector<std::string> appArgs(const Options& o, int blur, const std::string& reportPath) {
  return {o.app,
          "--epochs",
          std::to_string(o.epochs),
          "--batch-size",
          std::to_string(o.batchSize),
          "--lr",
          std::to_string(o.lr),
          "--prefetch",
          std::to_string(o.prefetch),
          "--augment",
          o.augment,
          "--blur",
          std::to_string(blur),
          "--train-samples",
          std::to_string(o.samples),
          "--augmenters-per-node",
          std::to_string(o.perNode),
          "--data-dir",
          o.dataDir,
          "--device",
          o.device,
          "--report",
          reportPath};
}

std::string setupName(const Options& o, int blur, unsigned dataCount) {
  if (!o.sweepBlur.empty() || !o.sweepData.empty()) {
    return "blur " + std::to_string(blur) + ", " + std::to_string(dataCount) + " data";
  }
  return dataCount ? "heterogeneous" : "homogeneous";
}

// The data instances' CPUs: one each, after the dnn CPU.
std::string dataCpus(const Options& o, unsigned dataCount) {
  std::string list;
  for (unsigned i = 1; i <= dataCount; ++i) list += (i > 1 ? "," : "") + std::to_string(o.cpus.at(i));
  return list;
}

Run runSetup(const Options& o, int blur, unsigned dataCount, const fs::path& dir, unsigned round,
             unsigned attempt) {
  Run r;
  bool heterogeneous = dataCount > 0;
  r.setup = setupName(o, blur, dataCount);
  r.blur = blur;
  r.dataCount = dataCount;
  r.round = round;
  r.attempt = attempt;
  std::string stem = "blur" + std::to_string(blur) + "-data" + std::to_string(dataCount) + "-" +
                     std::to_string(round) + "-" + std::to_string(attempt);
  auto reportPath = (dir / (stem + ".json")).string();
  auto logPath = (dir / (stem + ".log")).string();
  // The head's loop can stall for seconds on this loaded machine (the driver loads the training
  // set on it), long enough for the default 3 s node timeout; a lost node would move the
  // augmenter and spoil the comparison, so the timeouts are generous here.
  std::vector<std::string> argv = {o.troupe,  "sim",
                                   "--group", "dnn_group=1:ml.p3.2xlarge",
                                   "--cpus",  "dnn_group=" + std::to_string(o.cpus[0]),
                                   "--env",   "dnn_group:TROUPE_NODE_TIMEOUT_MS=20000",
                                   "--out",   (dir / (stem + "-out")).string()};
  if (heterogeneous) {
    argv.push_back("--group");
    argv.push_back("data_group=" + std::to_string(dataCount) + ":ml.c5.xlarge");
    argv.push_back("--cpus");
    if (o.dataShare < 1) {
      // Instances smaller than a CPU: all on the data CPU, each in a cgroup with its share.
      argv.push_back("data_group=" + std::to_string(o.cpus.at(1)));
      argv.push_back("--cpu-quota");
      argv.push_back("data_group=" + std::to_string(o.dataShare));
    } else {
      argv.push_back("data_group=" + dataCpus(o, dataCount));
    }
    argv.push_back("--env");
    argv.push_back("data_group:TROUPE_HEAD_TIMEOUT_MS=20000");
  }
  argv.push_back("--");
  auto app = appArgs(o, blur, reportPath);
  argv.insert(argv.end(), app.begin(), app.end());

  fprintf(stderr, "bench_pipeline: %s, round %u%s ...\n", r.setup.c_str(), round + 1,
          attempt ? (", attempt " + std::to_string(attempt + 1)).c_str() : "");
  auto start = Clock::now();
  auto busyBefore = cpuBusySeconds();
  // Pinning `troupe sim` to the dnn CPU before exec makes every instance start on that one CPU
  // (TROUPE_CPUS then moves the data instance to its own): threads that libraries start before
  // main() -- OpenBLAS's pool -- are pinned too, and OpenBLAS sizes its pool for one CPU. Unpinned,
  // those threads keep the whole machine, which TROUPE_CPUS (applied in main()) does not change.
  Child sim(argv, {}, logPath, o.simUnpinned ? -1 : static_cast<int>(o.cpus[0]), o.nice);
  PinWatch watch;
  auto lastSample = Clock::now();
  int code = sim.wait(o.timeoutSeconds, [&] {
    if (secondsSince(lastSample) < 0.25) return;
    lastSample = Clock::now();
    watch.scan(sim.output());
    watch.sample();
  });
  r.wallSeconds = secondsSince(start);
  auto busyAfter = cpuBusySeconds();
  auto output = sim.output();
  if (code != 0) {
    sim.stop();
    throw std::runtime_error(r.setup + " run " +
                             (code < 0
                                  ? "timed out after " + std::to_string(o.timeoutSeconds) + " s"
                                  : "exited with " + std::to_string(code)) +
                             " (log " + logPath + "):\n" + tail(output, 25));
  }
  std::ifstream in(reportPath);
  if (!in) throw std::runtime_error(r.setup + " run wrote no report " + reportPath);
  r.report = json::parse(in);
  r.pinning = watch.report();
  // Other engineers' processes share these CPUs: how much of each they took during the run.
  r.cpus = json::array();
  for (unsigned i = 0; i <= dataCount; ++i) {
    unsigned cpu = o.cpus[i];
    double busy = busyAfter[cpu] - busyBefore[cpu], mine = 0;
    for (auto& p : r.pinning) {
      if (p.at("cpus") == std::to_string(cpu)) mine += p.at("cpu_seconds").get<double>();
    }
    double other = std::max(0.0, busy - mine);
    r.cpus.push_back({{"cpu", cpu},
                      {"busy_seconds", busy},
                      {"instance_seconds", mine},
                      {"other_seconds", other},
                      {"other_share", other / r.wallSeconds}});
  }
  r.restarted = output.find("restarting '") != std::string::npos ||
                output.find("was lost") != std::string::npos;
  for (auto& p : r.report.at("placements")) {
    if (p.at("type") == "train.Augmenter" &&
        p.at("group") != (heterogeneous ? "data_group" : "dnn_group")) {
      throw std::runtime_error("augmenter placed on " + p.at("group").get<std::string>() +
                               " in the " + r.setup + " run (log " + logPath + ")");
    }
  }
  return r;
}

// =============================================================================================
// Figures and output.

json probe(const Options& o, const std::string& kind, const fs::path& dir, const char* self) {
  fprintf(stderr, "bench_pipeline: measuring costs (%s) on CPU %u ...\n", kind.c_str(), o.cpus[0]);
  static int count = 0;
  auto outPath = (dir / ("probe-" + kind + "-" + std::to_string(count++) + ".out")).string();
  std::vector<std::string> argv = {self,
                                   "--probe",
                                   kind,
                                   "--blur",
                                   std::to_string(o.blur),
                                   "--batch-size",
                                   std::to_string(o.batchSize),
                                   "--train-samples",
                                   std::to_string(o.samples),
                                   "--lr",
                                   std::to_string(o.lr),
                                   "--device",
                                   o.device,
                                   "--cpus",
                                   std::to_string(o.cpus[0]) + "," + std::to_string(o.cpus[1]),
                                   "--measure-seconds",
                                   std::to_string(o.measureSeconds),
                                   "--data-dir",
                                   o.dataDir};
  // OMP_WAIT_POLICY as hetero_train sets it; "pinned" is pinned before exec, "late-pin" after.
  Child child(argv, {"OMP_WAIT_POLICY=passive"}, outPath,
              kind == "pinned" ? static_cast<int>(o.cpus[0]) : -1, o.nice);
  int code = child.wait(120);
  auto text = child.output();
  if (code != 0) {
    throw std::runtime_error("cost probe (" + kind + ") failed with " + std::to_string(code) +
                             ":\n" + tail(text, 10));
  }
  auto at = text.rfind("\n{");
  return json::parse(text.substr(at == std::string::npos ? 0 : at + 1));
}

struct Summary {
  json best;  // the run with the lowest mean step time
  json report;  // its hetero_train report
  std::vector<double> steps;
};

Summary summarize(const std::vector<Run>& runs, const std::string& setup) {
  Summary s;
  double bestMs = INFINITY;
  for (auto& r : runs) {
    if (r.setup != setup || r.restarted) continue;
    double ms = r.report.at("mean_step_ms").get<double>();
    s.steps.push_back(ms);
    if (ms < bestMs) {
      bestMs = ms;
      s.report = r.report;
      s.best = {{"round", r.round + 1},
                {"mean_step_ms", ms},
                {"samples_per_s", r.report.at("samples_per_s")},
                {"data_wait_fraction", r.report.at("data_wait_fraction")},
                {"epoch_seconds", json::array()},
                {"test_accuracy", r.report.at("epochs").back().at("test_accuracy")},
                {"wall_seconds", r.wallSeconds},
                {"pinning", r.pinning},
                {"cpus", r.cpus}};
      for (auto& e : r.report.at("epochs")) s.best["epoch_seconds"].push_back(e.at("seconds"));
    }
  }
  return s;
}

// The sizing advisor (deploy/advise/advise.h) on `base`, a report of one of this bench's runs,
// for `dataCount` data instances. The bench pins the dnn instance to one CPU and gives each data
// instance `dataShare` of one, so those are their vCPUs here, not their instance types'.
hetero_train::advise::Row predictSetup(const json& base, unsigned dataCount, double dataShare) {
  namespace adv = hetero_train::advise;
  auto m = adv::fromReport(base);
  m.dnnVcpus = 1;
  m.dataVcpus = dataShare;  // `base`'s own data instances, if it had any
  return adv::predict(m, {"ml.c5.xlarge", dataCount, dataShare}, hetero_train::Prices());
}

std::string fmtShare(double share) {
  char text[32];
  snprintf(text, sizeof(text), "%g", share);
  return text;
}

// What a setup's measured step costs per 1,000 steps at the instance table's prices.
double measuredCostPer1000(double stepMs, unsigned dataCount) {
  hetero_train::Prices prices;
  double perHour = prices.perHour("ml.p3.2xlarge", false).value_or(0) +
                   dataCount * prices.perHour("ml.c5.xlarge", false).value_or(0);
  return perHour * stepMs / 3600.0;
}

// Runs one setup once (again, up to --attempts, when an instance was lost).
void runRounds(const Options& o, int blur, unsigned dataCount, const fs::path& dir,
               std::vector<Run>& runs, unsigned round) {
  for (unsigned attempt = 0;; ++attempt) {
    runs.push_back(runSetup(o, blur, dataCount, dir, round, attempt));
    if (!runs.back().restarted) return;
    fprintf(stderr, "bench_pipeline: an instance was lost and an actor restarted; %s\n",
            attempt + 1 < o.attempts ? "running it again" : "giving up");
    if (attempt + 1 >= o.attempts) {
      throw std::runtime_error("the " + runs.back().setup + " run lost an instance " +
                               std::to_string(o.attempts) + " times");
    }
  }
}

double loadAverage() {
  double l = 0;
  std::ifstream("/proc/loadavg") >> l;
  return l;
}

// --sweep-blur / --sweep-data-instances: every (blur, data instances) setup, best of --rounds; the
// advisor predicts each from the same blur's setup with the fewest data instances (one run, as a
// user has), and its recommendation (the cheapest at the instance table's prices) is held against
// the fastest measured.
int runSweep(const Options& o, const fs::path& dir) {
  std::vector<int> blurs = o.sweepBlur.empty() ? std::vector<int>{o.blur} : o.sweepBlur;
  std::vector<unsigned> counts = o.sweepData.empty() ? std::vector<unsigned>{0, 1} : o.sweepData;
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  unsigned from = o.predictFrom >= 0 ? unsigned(o.predictFrom) : counts.front();
  if (std::find(counts.begin(), counts.end(), from) == counts.end()) {
    throw std::invalid_argument("--predict-from " + std::to_string(from) +
                                ": not among the swept data-group sizes");
  }
  double loadBefore = loadAverage();
  std::vector<Run> runs;
  for (unsigned round = 0; round < o.rounds; ++round) {
    for (int blur : blurs) {
      for (unsigned n : counts) runRounds(o, blur, n, dir, runs, round);
    }
  }
  double loadAfter = loadAverage();
  const double targetError = 0.15;
  bool met = true;
  unsigned heldOutRows = 0, heldOutWithin = 0;
  json setups = json::array(), perBlur = json::array();
  for (int blur : blurs) {
    auto base = summarize(runs, setupName(o, blur, from));
    double bestMs = INFINITY, cheapest = INFINITY, cheapestMeasured = INFINITY;
    std::map<unsigned, double> measuredCost;
    unsigned bestCount = 0, recommended = 0, cheapestCount = 0;
    // The base run's own row is predicted from the next size's run (or the one before, for the
    // largest), so every row is held out: a prediction from its own run is near 0% by
    // construction and tests nothing.
    auto at = std::find(counts.begin(), counts.end(), from);
    std::optional<unsigned> other;
    if (counts.size() > 1) other = at + 1 != counts.end() ? *(at + 1) : *(at - 1);
    double oneMs = 0;  // the step with one data instance: the linear line's slope
    for (unsigned n : counts) {
      if (n == 1) oneMs = summarize(runs, setupName(o, blur, 1)).best.at("mean_step_ms").get<double>();
    }
    double previousRate = 0;
    unsigned previousCount = 0;
    std::optional<unsigned> saturated;
    for (unsigned n : counts) {
      auto s = summarize(runs, setupName(o, blur, n));
      unsigned predictedFrom = n == from && other ? *other : from;
      auto p = predictSetup(
          n == from && other ? summarize(runs, setupName(o, blur, *other)).report : base.report, n,
          o.dataShare);
      double measured = s.best.at("mean_step_ms").get<double>();
      double error = p.stepMs / measured - 1;
      bool heldOut = predictedFrom != n;
      // Throughput, and against linear scaling in the number of data instances (n times the
      // one-instance run's), and what the last instance added, as a share of one instance's.
      double rate = 1000.0 * o.batchSize / measured;
      double oneRate = oneMs > 0 ? 1000.0 * o.batchSize / oneMs : 0;
      double ofLinear = n > 0 && oneRate > 0 ? rate / (n * oneRate) : NAN;
      double added = n > 0 && previousCount + 1 == n && previousCount > 0 && oneRate > 0
                         ? (rate - previousRate) / oneRate
                         : NAN;
      if (!saturated && !std::isnan(added) && added < 0.5) saturated = previousCount;
      previousRate = rate;
      previousCount = n;
      if (heldOut) {
        ++heldOutRows;
        heldOutWithin += std::fabs(error) <= targetError;
      }
      met = met && (!heldOut || std::fabs(error) <= targetError);
      if (measured < bestMs) bestMs = measured, bestCount = n;
      double cost = measuredCostPer1000(measured, n);
      measuredCost[n] = cost;
      if (cost < cheapestMeasured) cheapestMeasured = cost, cheapestCount = n;
      if (p.costPer1000 < cheapest) cheapest = p.costPer1000, recommended = n;
      setups.push_back({{"blur", blur},
                        {"data_instances", n},
                        {"measured_step_ms", measured},
                        {"predicted_step_ms", p.stepMs},
                        {"error", error},
                        {"held_out", heldOut},
                        {"measured_data_wait_fraction", s.best.at("data_wait_fraction")},
                        {"predicted_data_wait_fraction", p.waitShare},
                        {"predicted_cost_per_1000_steps_usd", p.costPer1000},
                        {"measured_cost_per_1000_steps_usd", cost},
                        {"predicted_from_data_instances", predictedFrom},
                        {"samples_per_s", rate},
                        {"of_linear", std::isnan(ofLinear) ? json(nullptr) : json(ofLinear)},
                        {"added_instance_efficiency", std::isnan(added) ? json(nullptr) : json(added)},
                        {"predicted_samples_per_s", 1000.0 * o.batchSize / p.stepMs},
                        {"rates", s.report.at("rates")},
                        {"round", s.best.at("round")}});
    }
    // The recommendation is the cheapest predicted: held against the cheapest measured.
    unsigned apart =
        recommended > cheapestCount ? recommended - cheapestCount : cheapestCount - recommended;
    met = met && apart <= 1;
    perBlur.push_back({{"blur", blur},
                       {"fastest_measured_data_instances", bestCount},
                       {"cheapest_measured_data_instances", cheapestCount},
                       {"recommended_data_instances", recommended},
                       {"recommended_cost_above_cheapest",
                        measuredCost[recommended] / cheapestMeasured - 1},
                       {"within_one", apart <= 1},
                       {"saturates_at_data_instances", saturated ? json(*saturated) : json(nullptr)}});
  }
  json out = {{"bench", "pipeline"},
              {"mode", "sweep"},
              {"settings",
               {{"blurs", blurs},
                {"data_instances", counts},
                {"batch_size", o.batchSize},
                {"epochs", o.epochs},
                {"train_samples", o.samples},
                {"prefetch", o.prefetch},
                {"augmenters_per_node", o.perNode},
                {"cpus", o.cpus},
                {"data_cpu_share", o.dataShare},
                {"rounds", o.rounds}}},
              {"load_average", {{"before", loadBefore}, {"after", loadAfter}}},
              {"setups", setups},
              {"per_blur", perBlur},
              {"target_error", targetError},
              {"held_out_predictions", heldOutRows},
              {"held_out_within_target", heldOutWithin},
              {"targets_met", met}};
  if (!o.keep.empty()) out["kept"] = dir.string();
  if (!o.jsonOut.empty()) std::ofstream(o.jsonOut) << out.dump(2) << "\n";
  if (o.json) {
    printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::string sizes = o.dataShare < 1 ? "dnn CPU " + std::to_string(o.cpus[0]) +
                                           ", each data instance " + fmtShare(o.dataShare) +
                                           " of CPU " + std::to_string(o.cpus[1])
                                     : "one CPU per instance (dnn CPU " +
                                           std::to_string(o.cpus[0]) + ")";
  printf(
      "bench_pipeline sweep: hetero_train --batch-size %u --train-samples %lu --epochs %u "
      "--augmenters-per-node %u; %s; best of %u rounds; load average %.1f -> %.1f\n",
      o.batchSize, (unsigned long)o.samples, o.epochs, o.perNode, sizes.c_str(), o.rounds,
      loadBefore, loadAfter);
  printf(
      "predicted: the sizing advisor (docs/advisor.md) from the same blur's run with %u data "
      "instances\n\n",
      from);
  printf("%5s %5s %12s %12s %8s %10s %10s %10s %9s %9s %5s\n", "blur", "data", "measured ms",
         "predicted ms", "error", "wait meas", "wait pred", "samples/s", "of linear", "added",
         "from");
  auto share = [](const json& v) {
    return v.is_null() ? std::string("-") : fmtShare(std::round(1000 * v.get<double>()) / 10) + "%";
  };
  for (auto& r : setups) {
    printf("%5d %5u %12.1f %12.1f %+7.1f%% %9.1f%% %9.1f%% %10.0f %9s %9s %5u%s\n",
           r.at("blur").get<int>(), r.at("data_instances").get<unsigned>(),
           r.at("measured_step_ms").get<double>(), r.at("predicted_step_ms").get<double>(),
           100 * r.at("error").get<double>(),
           100 * r.at("measured_data_wait_fraction").get<double>(),
           100 * r.at("predicted_data_wait_fraction").get<double>(),
           r.at("samples_per_s").get<double>(), share(r.at("of_linear")).c_str(),
           share(r.at("added_instance_efficiency")).c_str(),
           r.at("predicted_from_data_instances").get<unsigned>(),
           !r.at("held_out").get<bool>() ? "  (from itself: not counted)"
           : std::fabs(r.at("error").get<double>()) <= targetError ? ""
                                                                    : "  (outside 15%)");
  }
  printf("(of linear: samples/s over n times the 1-instance run's; added: what the n-th instance "
         "added, as a share of one instance's samples/s; from: the run the prediction came from)\n");
  printf("\n%5s %10s %10s %12s %22s %10s\n", "blur", "fastest", "cheapest", "recommended",
         "its measured cost", "saturates");
  for (auto& b : perBlur) {
    auto sat = b.at("saturates_at_data_instances");
    printf("%5d %10u %10u %12u %+21.1f%% %10s%s\n", b.at("blur").get<int>(),
           b.at("fastest_measured_data_instances").get<unsigned>(),
           b.at("cheapest_measured_data_instances").get<unsigned>(),
           b.at("recommended_data_instances").get<unsigned>(),
           100 * b.at("recommended_cost_above_cheapest").get<double>(),
           sat.is_null() ? "-" : std::to_string(sat.get<unsigned>()).c_str(),
           b.at("within_one").get<bool>() ? "" : "  (more than one apart)");
  }
  printf("\nheld-out predictions within 15%%: %u of %u\n", heldOutWithin, heldOutRows);
  printf(
      "targets (every held-out prediction within 15%%, every recommendation within one instance "
      "of the cheapest measured): %s\n",
      met ? "MET" : "NOT MET");
  if (!o.keep.empty()) printf("logs and reports: %s\n", dir.c_str());
  return 0;
}

int runBench(const Options& o, const char* self) {
  fs::path dir;
  if (o.keep.empty()) {
    char tmpl[] = "/tmp/bench-pipeline-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir = tmpl;
  } else {
    dir = fs::absolute(o.keep);
    fs::create_directories(dir);
  }
  struct Cleanup {
    fs::path dir;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } cleanup{dir, !o.keep.empty()};
  if (!o.sweepBlur.empty() || !o.sweepData.empty()) return runSweep(o, dir);

  double loadBefore = loadAverage();
  // The costs are measured once per round, before its runs, and the lowest of each counts, as
  // the fastest run of each setup does: other load on this machine only ever adds time.
  json costs;
  auto latePin = probe(o, "late-pin", dir, self);

  std::vector<Run> runs;
  for (unsigned round = 0; round < o.rounds; ++round) {
    auto c = probe(o, "pinned", dir, self);
    if (costs.is_null()) costs = c;
    for (auto& [key, value] : c.items()) {
      if (!value.is_number_float()) continue;
      double v = value.get<double>();
      double& best = costs[key].get_ref<double&>();
      best = key.find("per_s") != std::string::npos ? std::max(best, v) : std::min(best, v);
    }
    for (unsigned dataCount : {0u, 1u}) runRounds(o, o.blur, dataCount, dir, runs, round);
  }
  double loadAfter = loadAverage();

  auto hom = summarize(runs, "homogeneous");
  auto het = summarize(runs, "heterogeneous");
  double homMs = hom.best.at("mean_step_ms"), hetMs = het.best.at("mean_step_ms");
  // The advisor's predictions for both setups from the homogeneous run's report alone.
  auto homPredicted = predictSetup(hom.report, 0, o.dataShare),
       hetPredicted = predictSetup(hom.report, 1, o.dataShare);
  hom.best["predicted_step_ms"] = homPredicted.stepMs;
  het.best["predicted_step_ms"] = hetPredicted.stepMs;
  hom.best["predicted_data_wait_fraction"] = homPredicted.waitShare;
  het.best["predicted_data_wait_fraction"] = hetPredicted.waitShare;
  json advisor = {
      {"predicted_from", "homogeneous"},
      {"rates", hom.report.at("rates")},
      {"homogeneous",
       {{"predicted_step_ms", homPredicted.stepMs},
        {"measured_step_ms", homMs},
        {"error", homPredicted.stepMs / homMs - 1}}},
      {"heterogeneous",
       {{"predicted_step_ms", hetPredicted.stepMs},
        {"measured_step_ms", hetMs},
        {"error", hetPredicted.stepMs / hetMs - 1}}},
      {"target_error", 0.15},
      {"target_met", std::fabs(homPredicted.stepMs / homMs - 1) <= 0.15 &&
                         std::fabs(hetPredicted.stepMs / hetMs - 1) <= 0.15}};
  double aug = costs.at("augment_batch_ms"), train = costs.at("train_step_ms");
  double speedup = homMs / hetMs;
  double idealCpu = 2.0;  // two pinned CPUs against one
  double idealCosts = (aug + train) / std::max(aug, train);
  uint64_t stepsPerEpoch = (o.samples + o.batchSize - 1) / o.batchSize;
  double evalPerStep = costs.at("evaluate_ms").get<double>() / stepsPerEpoch;
  // hetero_train's step time is epoch wall time over steps, so it also carries each epoch's test
  // evaluation, which runs on the trainer's CPU in both setups and does not overlap augmentation.
  double idealWithEval = (aug + train + evalPerStep) / (std::max(aug, train) + evalPerStep);
  // In the heterogeneous run both CPUs are busy at once; on a VM whose two vCPUs share a core
  // (or caches, memory bandwidth) each cost is then higher than alone.
  double augBusy = costs.at("augment_batch_ms_other_cpu_busy");
  double trainBusy = costs.at("train_step_ms_other_cpu_busy");
  double idealBusy = (aug + train + evalPerStep) / (std::max(augBusy, trainBusy) + evalPerStep);
  const double target = 0.9;
  // The same costs as the runs paid them: each instance's CPU time (startup included) per step.
  uint64_t steps = stepsPerEpoch * o.epochs;
  auto cpuPerStep = [&](const json& best, const std::string& group) {
    for (auto& p : best.at("pinning")) {
      if (p.at("group") == group) return 1000 * p.at("cpu_seconds").get<double>() / steps;
    }
    return 0.0;
  };
  json inRuns = {{"homogeneous_dnn_cpu_ms_per_step", cpuPerStep(hom.best, "dnn_group")},
                 {"heterogeneous_dnn_cpu_ms_per_step", cpuPerStep(het.best, "dnn_group")},
                 {"heterogeneous_data_cpu_ms_per_step", cpuPerStep(het.best, "data_group")}};

  json out = {
      {"bench", "pipeline"},
      {"settings",
       {{"blur", o.blur},
        {"batch_size", o.batchSize},
        {"epochs", o.epochs},
        {"train_samples", o.samples},
        {"prefetch", o.prefetch},
        {"augmenters_per_node", o.perNode},
        {"lr", o.lr},
        {"dnn_cpu", o.cpus[0]},
        {"data_cpu", o.cpus[1]},
        {"rounds", o.rounds},
        {"sim_pinned_before_exec", !o.simUnpinned},
        {"nice", o.nice},
        {"steps_per_epoch", stepsPerEpoch}}},
      {"load_average", {{"before", loadBefore}, {"after", loadAfter}}},
      {"costs",
       {{"how",
         "libraries called directly on one thread of a process pinned (before exec) to the "
         "dnn CPU; medians per batch"},
        {"augment_images_per_s", costs.at("augment_images_per_s")},
        {"augment_images_per_s_no_blur", costs.at("augment_images_per_s_no_blur")},
        {"augment_batch_ms", aug},
        {"train_step_ms", train},
        {"train_step_ms_late_pin", latePin.at("train_step_ms")},
        {"late_pin_openblas_threads", latePin.at("openblas_threads")},
        {"train_step_ms_late_pin_one_blas_thread",
         latePin.value("train_step_ms_one_blas_thread", latePin.at("train_step_ms").get<double>())},
        {"augment_batch_ms_other_cpu_busy", augBusy},
        {"train_step_ms_other_cpu_busy", trainBusy},
        {"evaluate_ms", costs.at("evaluate_ms")},
        {"evaluate_ms_per_step", evalPerStep},
        {"openblas_threads", costs.at("openblas_threads")}}},
      {"homogeneous", hom.best},
      {"heterogeneous", het.best},
      {"advisor", advisor},
      {"cpu_ms_per_step_in_runs", inRuns},
      {"model_step_ms", {{"homogeneous", aug + train}, {"heterogeneous", std::max(aug, train)}}},
      {"speedup", speedup},
      {"ideal_speedup_cpu_ratio", idealCpu},
      {"ideal_speedup_costs", idealCosts},
      {"fraction_of_ideal_cpu_ratio", speedup / idealCpu},
      {"fraction_of_ideal_costs", speedup / idealCosts},
      {"ideal_speedup_costs_with_evaluation", idealWithEval},
      {"fraction_of_ideal_costs_with_evaluation", speedup / idealWithEval},
      {"ideal_speedup_costs_other_cpu_busy", idealBusy},
      {"fraction_of_ideal_costs_other_cpu_busy", speedup / idealBusy},
      {"target_fraction", target},
      {"target_met", speedup / idealCosts >= target},
      {"runs", json::array()}};
  for (auto& r : runs) {
    out["runs"].push_back({{"setup", r.setup},
                           {"round", r.round + 1},
                           {"attempt", r.attempt + 1},
                           {"restarted", r.restarted},
                           {"mean_step_ms", r.report.at("mean_step_ms")},
                           {"data_wait_fraction", r.report.at("data_wait_fraction")},
                           {"wall_seconds", r.wallSeconds},
                           {"cpus", r.cpus}});
  }
  if (!o.keep.empty()) out["kept"] = dir.string();

  if (o.json) {
    printf("%s\n", out.dump().c_str());
    return 0;
  }
  printf(
      "bench_pipeline: hetero_train --blur %d --batch-size %u --train-samples %lu --epochs %u "
      "--prefetch %u --augmenters-per-node %u; dnn CPU %u, data CPU %u; best of %u rounds; "
      "load average %.1f -> %.1f\n\n",
      o.blur, o.batchSize, (unsigned long)o.samples, o.epochs, o.prefetch, o.perNode, o.cpus[0],
      o.cpus[1], o.rounds, loadBefore, loadAfter);
  printf(
      "per-core costs (libraries on one thread, one pinned CPU, median per batch of %u, best "
      "of %u)\n",
      o.batchSize, o.rounds);
  printf("  %-34s %8.0f images/s  (%.1f ms per batch; %.0f images/s without blur)\n",
         ("augmentation, blur " + std::to_string(o.blur)).c_str(),
         costs.at("augment_images_per_s").get<double>(), aug,
         costs.at("augment_images_per_s_no_blur").get<double>());
  printf("  %-34s %8.1f ms/step  (compute-only bound, data always ready)\n", "training step",
         train);
  printf("  %-34s %8.1f ms/step  (as troupe::run pins: %d OpenBLAS threads, one not pinned)\n",
         "  same, pinned after start-up", latePin.at("train_step_ms").get<double>(),
         latePin.at("openblas_threads").get<int>());
  printf("  %-34s %8.1f ms/epoch (%.2f ms per step)\n", "test evaluation, 10k images",
         costs.at("evaluate_ms").get<double>(), evalPerStep);
  printf("  %-34s %8.1f ms/batch augmenting, %.1f ms/step training (%+.0f%%, %+.0f%%)\n\n",
         "while the other CPU augments", augBusy, trainBusy, 100 * (augBusy / aug - 1),
         100 * (trainBusy / train - 1));

  printf("%-14s %5s %13s %13s %15s %10s %10s %10s\n", "setup", "CPUs", "mean step ms",
         "model ms", "advisor ms", "samples/s", "data wait", "accuracy");
  auto row = [&](const char* name, int cpus, const json& b, double model, const char* how) {
    double predicted = b.at("predicted_step_ms").get<double>();
    printf("%-14s %5d %13.1f %13.1f %7.1f (%+4.0f%%) %10.0f %9.1f%% %10.4f  model: %s\n", name,
           cpus, b.at("mean_step_ms").get<double>(), model, predicted,
           100 * (predicted / b.at("mean_step_ms").get<double>() - 1),
           b.at("samples_per_s").get<double>(), 100 * b.at("data_wait_fraction").get<double>(),
           b.at("test_accuracy").get<double>(), how);
  };
  row("homogeneous", 1, hom.best, aug + train, "aug + train");
  row("heterogeneous", 2, het.best, std::max(aug, train), "max(aug, train)");
  printf(
      "%-14s the sizing advisor's step (docs/advisor.md) for both setups from the homogeneous "
      "run's report alone; within 15%%: %s\n",
      "advisor ms", advisor.at("target_met").get<bool>() ? "MET" : "NOT MET");
  printf(
      "%-14s CPU time per step, startup included: homogeneous dnn %.1f ms; heterogeneous "
      "dnn %.1f ms, data %.1f ms\n",
      "in the runs", inRuns["homogeneous_dnn_cpu_ms_per_step"].get<double>(),
      inRuns["heterogeneous_dnn_cpu_ms_per_step"].get<double>(),
      inRuns["heterogeneous_data_cpu_ms_per_step"].get<double>());
  printf("\n%-36s %6.2fx\n", "speedup", speedup);
  printf("%-36s %6.2fx   achieved %.2f\n", "ideal from the CPU ratio (2 : 1)", idealCpu,
         speedup / idealCpu);
  printf("%-36s %6.2fx   achieved %.2f\n", "ideal from costs (a+t)/max(a,t)", idealCosts,
         speedup / idealCosts);
  printf("%-36s %6.2fx   achieved %.2f\n", "  same, with the per-step evaluation", idealWithEval,
         speedup / idealWithEval);
  printf("%-36s %s (%.3f of the cost ideal, %.3f of the CPU ratio; target %.1f)\n", "target",
         speedup / idealCosts >= target ? "MET" : "NOT MET", speedup / idealCosts,
         speedup / idealCpu, target);
  printf("\nruns (mean step ms):");
  for (auto& r : runs) {
    printf("  %s %u: %.1f%s", r.setup == "homogeneous" ? "hom" : "het", r.round + 1,
           r.report.at("mean_step_ms").get<double>(), r.restarted ? " (restarted, ignored)" : "");
  }
  printf("\n\n%-14s %-11s %4s %8s %8s %12s %10s  %s\n", "best runs", "group", "CPU", "wall s",
         "CPU s", "run-queue s", "others' s", "threads not on the instance's CPU (their CPU s)");
  for (auto* b : {&hom.best, &het.best}) {
    for (auto& p : b->at("pinning")) {
      double other = 0;
      for (auto& c : b->at("cpus")) {
        if (std::to_string(c.at("cpu").get<unsigned>()) == p.at("cpus"))
          other = c.at("other_seconds");
      }
      printf("%-14s %-11s %4s %8.1f %8.2f %12.2f %10.2f  %zu (%.2f s)\n",
             b == &hom.best ? "homogeneous" : "heterogeneous",
             p.at("group").get<std::string>().c_str(), p.at("cpus").get<std::string>().c_str(),
             b->at("wall_seconds").get<double>(), p.at("cpu_seconds").get<double>(),
             p.at("runqueue_wait_seconds").get<double>(), other,
             p.at("unpinned_threads").get<size_t>(), p.at("unpinned_cpu_seconds").get<double>());
    }
  }
  printf(
      "(CPU s: the instance's threads on a CPU; run-queue s: runnable, waiting for one; others' "
      "s:\n"
      " that CPU's busy time not spent by the instances -- other engineers' builds, the bench)\n");
  if (!o.keep.empty()) printf("logs and reports: %s\n", dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o;
  std::string cpus;
  CLI::App cli(
      "bench_pipeline: hetero_train on 1 pinned CPU (homogeneous) against 1 + 1 CPUs "
      "(heterogeneous) under troupe sim");
  cli.add_option("--augment", o.augment, "hetero_train's --augment preset (light or heavy)")
      ->check(CLI::IsMember({"light", "heavy"}))
      ->capture_default_str();
  cli.add_option("--blur", o.blur, "Gaussian blur kernel: the augmentation cost (odd 3..99)")
      ->check(CLI::Range(3, 99));
  cli.add_option("--batch-size", o.batchSize)->check(CLI::Range(1u, 8192u));
  cli.add_option("--epochs", o.epochs)->check(CLI::Range(1u, 100u));
  cli.add_option("--train-samples", o.samples)->check(CLI::Range(uint64_t(1), uint64_t(60000)));
  cli.add_option("--prefetch", o.prefetch, "batches in flight per augmenter")
      ->check(CLI::Range(1u, 64u));
  cli.add_option("--augmenters-per-node", o.perNode)->check(CLI::Range(1u, 64u));
  cli.add_option("--lr", o.lr);
  cli.add_option("--device", o.device,
                 "hetero_train's --device: the trainer on the CPU (default), a GPU (cuda) or "
                 "a GPU where there is one (auto)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cli.add_option("--cpus", cpus,
                 "DNN_CPU,DATA_CPU[,DATA_CPU...]: one per instance (default: those this process "
                 "may use)");
  cli.add_option("--sweep-blur", o.sweepBlur,
                 "blur kernels to sweep, e.g. 0,9,31 (0 = off), each held against the sizing "
                 "advisor's prediction")
      ->delimiter(',');
  cli.add_option("--sweep-data-instances", o.sweepData,
                 "data-group sizes to sweep, e.g. 0,1,2 (one CPU each; default with --sweep-blur: "
                 "0,1)")
      ->delimiter(',');
  cli.add_option("--data-cpu-share", o.dataShare,
                 "below 1: every data instance runs on the data CPU (the second of --cpus) in a "
                 "cgroup limited to this share of it (troupe sim --cpu-quota; needs root), so "
                 "a sweep can try more data instances than this machine has CPUs")
      ->check(CLI::Range(0.05, 1.0));
  cli.add_option("--predict-from", o.predictFrom,
                 "in a sweep: the data-group size whose run the advisor predicts every other "
                 "from (default: the smallest)")
      ->check(CLI::Range(0, 64));
  cli.add_option("--rounds", o.rounds, "runs of each setup; the fastest of each counts")
      ->check(CLI::Range(1u, 20u));
  cli.add_flag("--sim-unpinned", o.simUnpinned,
               "start troupe sim unpinned (instances pin themselves in main(); threads started "
               "before that are not pinned)");
  cli.add_option("--nice", o.nice,
                 "niceness of the runs (negative, as root, shields them from other load)")
      ->check(CLI::Range(-20, 19));
  cli.add_option("--attempts", o.attempts, "per run, when an instance was lost")
      ->check(CLI::Range(1u, 10u));
  cli.add_option("--timeout", o.timeoutSeconds, "seconds per run");
  cli.add_option("--measure-seconds", o.measureSeconds, "per cost measurement");
  cli.add_option("--keep", o.keep, "keep logs, reports and probe output in this directory");
  cli.add_option("--troupe", o.troupe, "the troupe binary");
  cli.add_option("--app", o.app, "the hetero_train binary");
  cli.add_option("--data-dir", o.dataDir, "Fashion-MNIST IDX files");
  cli.add_flag("--json", o.json, "one JSON object instead of the table");
  cli.add_option("--json-out", o.jsonOut, "in a sweep: also write the JSON object to this file");
  cli.add_option("--probe", o.probe)->group("")->check(CLI::IsMember({"pinned", "late-pin"}));
  CLI11_PARSE(cli, argc, argv);
  if (o.blur % 2 == 0) {
    fprintf(stderr, "bench_pipeline: --blur must be odd\n");
    return 2;
  }
  for (int b : o.sweepBlur) {
    if (b != 0 && (b < 3 || b > 99 || b % 2 == 0)) {
      fprintf(stderr, "bench_pipeline: --sweep-blur %d: a blur is 0 (off) or odd 3..99\n", b);
      return 2;
    }
  }
  if (cpus.empty()) {
    o.cpus = allowedCpus();
    if (o.cpus.size() < 2) {
      fprintf(stderr, "bench_pipeline: needs two CPUs, this process may use %zu\n",
              o.cpus.size());
      return 2;
    }
  } else {
    std::stringstream list(cpus);
    std::string item;
    std::set<unsigned> seen;
    while (std::getline(list, item, ',')) {
      char* end = nullptr;
      unsigned long c = strtoul(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || !seen.insert(unsigned(c)).second) {
        fprintf(stderr,
                "bench_pipeline: --cpus '%s': wants different CPU numbers, e.g. 0,1 (the dnn "
                "CPU first)\n",
                cpus.c_str());
        return 2;
      }
      o.cpus.push_back(unsigned(c));
    }
    if (o.cpus.size() < 2) {
      fprintf(stderr, "bench_pipeline: --cpus '%s': wants at least two CPUs, e.g. 0,1\n",
              cpus.c_str());
      return 2;
    }
  }
  for (unsigned n : o.sweepData) {
    if (o.dataShare < 1) {
      if (n * o.dataShare > 1 + 1e-9) {
        fprintf(stderr,
                "bench_pipeline: --sweep-data-instances %u with --data-cpu-share %g needs %g of "
                "the data CPU; at most %u instances fit\n",
                n, o.dataShare, n * o.dataShare, unsigned(1 / o.dataShare + 1e-9));
        return 2;
      }
    } else if (n + 1 > o.cpus.size()) {
      fprintf(stderr,
              "bench_pipeline: --sweep-data-instances %u needs %u CPUs (one for the dnn instance, "
              "one per data instance); there are %zu (--cpus, or this process's CPUs)\n",
              n, n + 1, o.cpus.size());
      return 2;
    }
  }

  if (o.predictFrom >= 0) {
    auto swept = o.sweepData.empty() ? std::vector<unsigned>{0, 1} : o.sweepData;
    if (o.sweepBlur.empty() && o.sweepData.empty()) {
      fprintf(stderr, "bench_pipeline: --predict-from needs a sweep (--sweep-blur or "
                      "--sweep-data-instances)\n");
      return 2;
    }
    if (std::find(swept.begin(), swept.end(), unsigned(o.predictFrom)) == swept.end()) {
      fprintf(stderr,
              "bench_pipeline: --predict-from %d: not among the swept data-group sizes; pick one "
              "of --sweep-data-instances (default 0,1)\n",
              o.predictFrom);
      return 2;
    }
  }

  if (!o.probe.empty()) {
    try {
      printf("\n%s\n", runProbe(o).dump().c_str());
      return 0;
    } catch (const std::exception& e) {
      fprintf(stderr, "bench_pipeline probe: %s\n", e.what());
      return 1;
    }
  }

  struct sigaction sa = {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  try {
    return runBench(o, "/proc/self/exe");
  } catch (const Interrupted& i) {
    fprintf(stderr, "bench_pipeline: %s; every child stopped and reaped\n", strsignal(i.signal));
    return 128 + i.signal;
  } catch (const std::exception& e) {
    fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
