// One run of hetero_train under `troupe sim` in a setup (bench_pipeline.h), with the pinning
// check: threads of an instance not confined to its CPUs, and the CPU time they use.

#include <unistd.h>

#include <iterator>
#include <regex>
#include <set>

#include "bench_pipeline.h"

namespace bench_pipeline {

namespace {

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

// The data instances' CPUs: one each, after the dnn CPU.
std::string dataCpus(const Options& o, unsigned dataCount) {
  std::string list;
  for (unsigned i = 1; i <= dataCount; ++i) list += (i > 1 ? "," : "") + std::to_string(o.cpus.at(i));
  return list;
}

}  // namespace

std::string setupName(const Options& o, int blur, unsigned dataCount) {
  if (!o.sweepBlur.empty() || !o.sweepData.empty()) {
    return "blur " + std::to_string(blur) + ", " + std::to_string(dataCount) + " data";
  }
  return dataCount ? "heterogeneous" : "homogeneous";
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

}  // namespace bench_pipeline
