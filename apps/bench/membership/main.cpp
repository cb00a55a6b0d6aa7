// bench_membership: what elastic membership costs a running hetero_train job (`make run`'s cluster
// and job: 2 x ml.c5.xlarge data instances, 1 x ml.p3.2xlarge, 5 epochs of 60,000 samples), each
// scenario measured from outside against the same job without a fault, in the same run:
//   baseline  no fault;
//   rejoin    kill -9 of one data instance's process once epoch 2 is under way; `troupe sim
//             --node-restarts 1` starts it again as the per-instance entry point does. Figures:
//             from the new process's start (the sim's "starting it again" line) to the head's
//             "rejoined" line, and to the trainer's "first batch from ... added as its node
//             joined" line: how long until the host works again;
//   drain     SIGTERM to one data instance once epoch 2 is under way: from the signal to the
//             instance's "exiting with 0: drained" line, and what it costs the trainer: the job's
//             time and data wait against the baseline's.
// Lines are timestamped as this program reads them from the sim's output (polled every 5 ms).
//
//   bench_membership [--repeat 1] [--json]

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "subprocess.h"

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace sp = troupe::subprocess;

namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double msBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One run of the job under `troupe sim`, watched line by line.
class Watched {
 public:
  explicit Watched(std::vector<std::string> simArgs) {
    char dir[] = "/tmp/bench-membership-XXXXXX";
    if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir;
    out_ = dir_ + "/sim.out";
    report_ = dir_ + "/report.json";
    std::vector<std::string> argv = {TROUPE_BINARY, "sim",
                                     "--group",     "data_group=2:ml.c5.xlarge",
                                     "--group",     "dnn_group=1:ml.p3.2xlarge"};
    argv.insert(argv.end(), simArgs.begin(), simArgs.end());
    argv.insert(argv.end(), {"--", HETERO_TRAIN, "--report", report_, "--progress-every", "0.2"});
    sp::Spec spec;
    spec.argv = argv;
    spec.out = sp::Stream::file(out_);
    spec.errToOut = true;
    spec.ownProcessGroup = true;
    spec.cwd = dir_;
    t0_ = Clock::now();
    sim_ = std::make_unique<sp::Child>(spec);
  }

  // The run's folder goes with it, unless the sim exited non-zero: then its log stays, and where.
  ~Watched() {
    if (code_ == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    } else {
      fprintf(stderr, "bench_membership: the sim exited %d; its output: %s\n", code_, out_.c_str());
    }
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

  // Reads what is new; returns false once the sim has exited (after a last read).
  bool poll() {
    auto code = sim_->poll();
    auto text = readFile(out_);
    auto now = Clock::now();
    size_t start = consumed_;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines_.push_back({text.substr(start, nl - start), now});
    }
    consumed_ = start;
    if (code) code_ = *code;
    if (!code && msBetween(t0_, now) > 300000) {
      sim_->stop(std::chrono::seconds(5));
      code_ = -1;
      return false;
    }
    return !code;
  }

  // When the first line containing `text` was read, from line `from` on.
  std::optional<Clock::time_point> when(const std::string& text, size_t* index = nullptr) const {
    for (size_t i = 0; i < lines_.size(); ++i) {
      if (lines_[i].text.find(text) != std::string::npos) {
        if (index) *index = i;
        return lines_[i].at;
      }
    }
    return std::nullopt;
  }
  const std::string* lineWith(const std::string& text) const {
    for (auto& l : lines_) {
      if (l.text.find(text) != std::string::npos) return &l.text;
    }
    return nullptr;
  }

  // A data instance's pid and host, from the sim's instance lines.
  std::pair<pid_t, std::string> dataInstance() const {
    static const std::regex line(R"(troupe sim: (algo-\d+)\s+data_group\s+\S+\s+\S+\s+pid=(\d+))");
    for (auto& l : lines_) {
      std::smatch m;
      if (std::regex_search(l.text, m, line)) return {std::stoi(m[2]), m[1]};
    }
    return {0, ""};
  }

  json report() const {
    try {
      return json::parse(readFile(report_));
    } catch (const std::exception&) {
      return json();
    }
  }
  int code() const { return code_; }
  double seconds() const { return lines_.empty() ? 0 : msBetween(t0_, lines_.back().at) / 1000; }

 private:
  struct Line {
    std::string text;
    Clock::time_point at;
  };
  std::string dir_, out_, report_;
  Clock::time_point t0_;
  std::unique_ptr<sp::Child> sim_;
  std::vector<Line> lines_;
  size_t consumed_ = 0;
  int code_ = -1;
};

struct Row {
  std::string scenario;
  int simExit = -1;
  bool allZero = false;
  double jobS = 0, dataWaitS = 0, dataWaitPct = 0;
  bool exactlyOnce = false;
  std::optional<double> rejoinJoinMs, rejoinFirstBatchMs, drainMs;
  std::string note;
  // An instance this machine froze (the node's own "frozen for N ms" line) past the node timeout,
  // which the head then fenced: the machine's doing, not troupe's, and no measure of it.
  std::string frozen;
};

Row finish(Watched& w, Row r) {
  while (w.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  r.simExit = w.code();
  r.allZero = w.lineWith("troupe sim: all 3 instances exited 0") != nullptr;
  if (auto* line = w.lineWith("this node was frozen for"); line && !r.allZero) r.frozen = *line;
  auto j = w.report();
  if (j.is_object()) {
    double seconds = 0;
    bool once = true;
    for (auto& e : j["epochs"]) {
      seconds += e["seconds"].get<double>();
      once = once && e["samples"] == 60000 && e["duplicates"] == 0 && e["missing"] == 0;
    }
    r.jobS = seconds;
    r.dataWaitPct = 100 * j["data_wait_fraction"].get<double>();
    r.dataWaitS = seconds * j["data_wait_fraction"].get<double>();
    r.exactlyOnce = once && j["epochs"].size() == 5;
  }
  return r;
}

// Waits until epoch 2 of 5 is under way, then `act` hits a data instance.
bool waitForEpoch2(Watched& w) {
  while (w.poll()) {
    if (w.when("progress: epoch 2/5")) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

Row baseline() {
  Watched w({"--node-restarts", "0"});
  return finish(w, {"baseline"});
}

Row rejoin() {
  Watched w({"--node-restarts", "1"});
  Row r{"rejoin"};
  if (!waitForEpoch2(w)) return finish(w, r);
  auto [pid, host] = w.dataInstance();
  kill(pid, SIGKILL);
  r = finish(w, r);
  auto restarted = w.when(host + " (data_group) was killed by signal 9");
  auto joined = w.when("membership: " + host + " (data_group) rejoined (incarnation 1)");
  auto first = w.when("on " + host + ", added as its node joined");
  if (restarted && joined) r.rejoinJoinMs = msBetween(*restarted, *joined);
  if (restarted && first) r.rejoinFirstBatchMs = msBetween(*restarted, *first);
  r.note = "kill -9 of " + host + "'s process in epoch 2, started again";
  return r;
}

Row drain() {
  Watched w({"--node-restarts", "0"});
  Row r{"drain"};
  if (!waitForEpoch2(w)) return finish(w, r);
  auto [pid, host] = w.dataInstance();
  auto sent = Clock::now();
  kill(pid, SIGTERM);
  r = finish(w, r);
  auto exited = w.when("exiting with 0: drained");
  if (exited) r.drainMs = msBetween(sent, *exited);
  r.note = "SIGTERM to " + host + " in epoch 2";
  return r;
}

std::string fmt(const std::optional<double>& v, const char* f = "%.0f") {
  if (!v) return "-";
  char b[32];
  snprintf(b, sizeof(b), f, *v);
  return b;
}

json toJson(const Row& r) {
  json j = {{"scenario", r.scenario},        {"sim_exit", r.simExit},
            {"all_exit_0", r.allZero},       {"job_s", r.jobS},
            {"data_wait_s", r.dataWaitS},    {"data_wait_pct", r.dataWaitPct},
            {"exactly_once", r.exactlyOnce}, {"note", r.note}};
  j["rejoin_start_to_joined_ms"] = r.rejoinJoinMs ? json(*r.rejoinJoinMs) : json();
  j["rejoin_start_to_first_batch_ms"] = r.rejoinFirstBatchMs ? json(*r.rejoinFirstBatchMs) : json();
  j["drain_signal_to_exit_ms"] = r.drainMs ? json(*r.drainMs) : json();
  if (!r.frozen.empty()) j["frozen"] = r.frozen;
  return j;
}

}  // namespace

int main(int argc, char* argv[]) {
  CLI::App cli(
      "bench_membership: a rejoin's time and a drain's cost in a running hetero_train job, "
      "against the same job without a fault");
  unsigned repeat = 1;
  bool asJson = false;
  cli.add_option("--repeat", repeat, "runs of each scenario")->check(CLI::Range(1u, 20u));
  cli.add_flag("--json", asJson, "one JSON object instead of the table");
  CLI11_PARSE(cli, argc, argv);

  // A scenario in which this machine froze an instance past the node timeout (a loaded CI
  // machine can stall one process for seconds) is run again, up to twice, saying so.
  auto measured = [](Row (*scenario)()) {
    Row r = scenario();
    for (int again = 0; again < 2 && !r.frozen.empty(); ++again) {
      fprintf(stderr, "bench_membership: %s: running it again: this machine froze an instance: %s\n",
              r.scenario.c_str(), r.frozen.c_str());
      r = scenario();
    }
    return r;
  };
  std::vector<Row> rows;
  for (unsigned i = 0; i < repeat; ++i) {
    rows.push_back(measured(baseline));
    rows.push_back(measured(rejoin));
    rows.push_back(measured(drain));
  }
  if (asJson) {
    json all = json::array();
    for (auto& r : rows) all.push_back(toJson(r));
    printf("%s\n", json{{"bench", "membership"}, {"runs", all}}.dump(2).c_str());
    return 0;
  }
  printf("%-9s %4s %6s %8s %10s %8s %16s %22s %14s  %s\n", "scenario", "exit", "all 0", "job s",
         "data wait", "exactly", "rejoin: joined", "rejoin: first batch", "drain: exit", "");
  printf("%-9s %4s %6s %8s %10s %8s %16s %22s %14s\n", "", "", "", "", "s (%)", "once",
         "ms after start", "ms after start", "ms after TERM");
  for (auto& r : rows) {
    char wait[32];
    snprintf(wait, sizeof(wait), "%.2f (%.0f%%)", r.dataWaitS, r.dataWaitPct);
    printf("%-9s %4d %6s %8.2f %10s %8s %16s %22s %14s  %s\n", r.scenario.c_str(), r.simExit,
           r.allZero ? "yes" : "no", r.jobS, wait, r.exactlyOnce ? "yes" : "no",
           fmt(r.rejoinJoinMs).c_str(), fmt(r.rejoinFirstBatchMs).c_str(), fmt(r.drainMs).c_str(),
           r.note.c_str());
  }
  return 0;
}
