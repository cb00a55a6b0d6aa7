// bench_compare (`make compare`): the seeds' table, measured. hetero_train runs under `troupe sim`
// on the homogeneous cluster (the dnn instance alone, its augmenters on its own vCPUs) and on
// `make run`'s heterogeneous one (the same instance plus 2 x ml.c5.xlarge), both with the CPU
// budget of the heterogeneous cluster (--cpu-scale: this machine's CPUs over its 16 vCPUs), so an
// instance has the same CPU in both. Printed per setup: instances, $/hour, mean step, $ per 1,000
// steps, and the advisor's prediction of that setup from the *other* run's report (held out); then
// the speedup and the saving, measured and predicted, beside the seeds' figures.
//
// Every run is judged as the cloud would: `troupe sim` exits 0 only when every instance did, and
// the report must show every sample once in every epoch; a run that fails either is reported and
// the bench exits 1. `--rounds N` runs each setup N times (alternating) and counts each round.
// Children run in their own process group with PR_SET_PDEATHSIG; SIGINT/SIGTERM is forwarded to
// the running `troupe sim` (which cascades it) and the bench waits for it before exiting.

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
namespace sp = troupe::subprocess;

struct Options {
  unsigned rounds = 1;
  bool json = false;
  std::string keep;
  std::string troupe = TROUPE_BINARY;
  std::string app = HETERO_TRAIN_BINARY;
  std::string dataDir = "/usr/share/datasets/fashion-mnist";
  std::vector<std::string> appArgs;
};

// The clusters: `make run`'s, and its dnn group alone.
const std::vector<std::string> kHetero = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                          "dnn_group=1:ml.p3.2xlarge"};
const std::vector<std::string> kHomo = {"--group", "dnn_group=1:ml.p3.2xlarge"};
constexpr double kHeteroVcpus = 8 + 2 * 4;

std::atomic<pid_t> running{0};

void forward(int) {
  pid_t pid = running.load();
  if (pid > 0) kill(-pid, SIGTERM);
}

struct Run {
  std::string setup;  // "homogeneous" or "heterogeneous"
  unsigned round = 0;
  int exit = -1;
  std::string problem;  // empty: every instance exited 0 and every sample was trained once
  double stepMs = 0, pricePerHour = 0, costPer1000 = 0, waitShare = 0, accuracy = 0;
  json report;
};

// The advisor's row for `dataCount` data instances in `report` (its `advice`).
const json* adviceRow(const json& report, unsigned dataCount) {
  if (!report.contains("advice") || !report["advice"].is_object()) return nullptr;
  for (auto& row : report["advice"]["rows"]) {
    if (row["data_count"] != dataCount) continue;
    if (dataCount == 0 || row["data_type"] == "ml.c5.xlarge") return &row;
  }
  return nullptr;
}

Run runOnce(const Options& o, const std::string& setup, unsigned round, double scale,
            const fs::path& dir) {
  Run r;
  r.setup = setup;
  r.round = round;
  auto report = dir / (setup + "-" + std::to_string(round) + ".json");
  auto log = dir / (setup + "-" + std::to_string(round) + ".log");
  sp::Spec spec;
  spec.argv = {o.troupe, "sim", "--cpu-scale", std::to_string(scale)};
  auto& groups = setup == "homogeneous" ? kHomo : kHetero;
  spec.argv.insert(spec.argv.end(), groups.begin(), groups.end());
  spec.argv.insert(spec.argv.end(), {"--channel", "train=" + o.dataDir, "--out",
                                     (dir / (setup + "-" + std::to_string(round) + "-out")).string(),
                                     "--", o.app, "--report", report.string()});
  spec.argv.insert(spec.argv.end(), o.appArgs.begin(), o.appArgs.end());
  spec.dropTroupeEnv = true;
  spec.out = sp::Stream::file(log.string());
  spec.errToOut = true;
  spec.ownProcessGroup = true;
  spec.parentDeathSignal = SIGTERM;
  if (!o.json) {
    fprintf(stderr, "bench_compare: round %u, %s (log: %s)\n", round, setup.c_str(), log.c_str());
  }
  {
    sp::Child child(spec);
    running = child.pid();
    r.exit = child.wait();
    running = 0;
  }
  if (r.exit != 0) {
    r.problem = "troupe sim exited " + std::to_string(r.exit) + " (see " + log.string() + ")";
    return r;
  }
  try {
    std::ifstream in(report);
    r.report = json::parse(in);
    r.stepMs = r.report.at("mean_step_ms").get<double>();
    r.pricePerHour = r.report.at("cluster_price_per_hour_usd").get<double>();
    r.costPer1000 = r.report.at("cost_per_1000_steps_usd").get<double>();
    r.waitShare = r.report.at("data_wait_fraction").get<double>();
    for (auto& e : r.report.at("epochs")) {
      r.accuracy = e.at("test_accuracy").get<double>();
      if (e.at("duplicates") != 0 || e.at("missing") != 0) {
        r.problem = "epoch " + e.at("epoch").dump() + ": " + e.at("duplicates").dump() +
                    " duplicates, " + e.at("missing").dump() + " missing";
      }
    }
  } catch (const std::exception& e) {
    r.problem = "report " + report.string() + ": " + e.what();
  }
  return r;
}

double cpusHere() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o;
  CLI::App cli(
      "bench_compare: the seeds' table measured: hetero_train on the dnn instance alone and on "
      "make run's heterogeneous cluster, same CPU per vCPU, with the advisor's predictions");
  cli.add_option("--rounds", o.rounds, "runs of each setup (alternating); every round is shown")
      ->check(CLI::Range(1u, 20u));
  cli.add_flag("--json", o.json, "one JSON object instead of the table");
  cli.add_option("--keep", o.keep, "keep logs and reports in this folder (default: a temporary one)");
  cli.add_option("--troupe", o.troupe, "the troupe binary");
  cli.add_option("--app", o.app, "the hetero_train binary");
  cli.add_option("--data-dir", o.dataDir, "Fashion-MNIST IDX files (the `train` channel)");
  cli.add_option("app-args", o.appArgs, "after --: more hetero_train flags, for both setups");
  CLI11_PARSE(cli, argc, argv);

  fs::path dir = o.keep;
  bool temporary = o.keep.empty();
  if (temporary) {
    char name[] = "/tmp/bench_compare-XXXXXX";
    if (mkdtemp(name) == nullptr) {
      perror("bench_compare: mkdtemp");
      return 1;
    }
    dir = name;
  }
  fs::create_directories(dir);
  struct sigaction sa = {};
  sa.sa_handler = forward;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  double scale = std::min(1.0, cpusHere() / kHeteroVcpus);
  std::vector<Run> runs;
  for (unsigned round = 1; round <= o.rounds; ++round) {
    for (auto setup : {"homogeneous", "heterogeneous"}) {
      runs.push_back(runOnce(o, setup, round, scale, dir));
      if (running == 0 && !runs.back().problem.empty() && runs.back().exit > 128) break;
    }
  }

  // Per round: each setup, the other's prediction of it, speedup and saving.
  json out = {{"cpu_scale", scale}, {"cpus", cpusHere()}, {"rounds", json::array()}};
  bool failed = false;
  char line[400];
  std::string table;
  snprintf(line, sizeof(line), "%-6s %-14s %-40s %8s %9s %11s %15s %17s\n", "round", "setup",
           "instances", "$/hour", "step ms", "$/1k steps", "predicted ms", "predicted $/1k");
  table += line;
  std::vector<double> speedups;
  for (unsigned round = 1; round <= o.rounds; ++round) {
    const Run* homo = nullptr;
    const Run* het = nullptr;
    for (auto& r : runs) {
      if (r.round != round) continue;
      (r.setup == "homogeneous" ? homo : het) = &r;
    }
    json jr = {{"round", round}};
    for (auto* r : {homo, het}) {
      if (r == nullptr) continue;
      bool isHomo = r == homo;
      const Run* other = isHomo ? het : homo;
      const json* predicted =
          other && other->problem.empty() ? adviceRow(other->report, isHomo ? 0 : 2) : nullptr;
      std::string instances =
          isHomo ? "1 x ml.p3.2xlarge" : "1 x ml.p3.2xlarge + 2 x ml.c5.xlarge";
      if (!r->problem.empty()) {
        failed = true;
        snprintf(line, sizeof(line), "%-6u %-14s %-40s FAILED: %s\n", round, r->setup.c_str(),
                 instances.c_str(), r->problem.c_str());
        table += line;
        jr[r->setup] = {{"problem", r->problem}, {"exit", r->exit}};
        continue;
      }
      double pStep = predicted ? (*predicted)["step_ms"].get<double>() : NAN;
      double pCost = predicted ? (*predicted)["cost_per_1000_steps_usd"].get<double>() : NAN;
      snprintf(line, sizeof(line), "%-6u %-14s %-40s %8.3f %9.2f %11.4f %15.2f %17.4f\n", round,
               r->setup.c_str(), instances.c_str(), r->pricePerHour, r->stepMs, r->costPer1000,
               pStep, pCost);
      table += line;
      jr[r->setup] = {{"instances", instances},
                      {"price_per_hour_usd", r->pricePerHour},
                      {"step_ms", r->stepMs},
                      {"cost_per_1000_steps_usd", r->costPer1000},
                      {"data_wait_fraction", r->waitShare},
                      {"test_accuracy", r->accuracy},
                      {"predicted_step_ms", predicted ? json(pStep) : json(nullptr)},
                      {"predicted_cost_per_1000_steps_usd", predicted ? json(pCost) : json(nullptr)},
                      {"exit", r->exit}};
    }
    if (homo && het && homo->problem.empty() && het->problem.empty()) {
      double speedup = homo->stepMs / het->stepMs;
      double saving = 1 - het->costPer1000 / homo->costPer1000;
      auto* ph = adviceRow(het->report, 0);
      auto* pe = adviceRow(homo->report, 2);
      double pSpeedup = ph && pe ? (*ph)["step_ms"].get<double>() / (*pe)["step_ms"].get<double>()
                                 : NAN;
      double pSaving = ph && pe ? 1 - (*pe)["cost_per_1000_steps_usd"].get<double>() /
                                          (*ph)["cost_per_1000_steps_usd"].get<double>()
                                : NAN;
      snprintf(line, sizeof(line),
               "%-6u speedup %.2fx, saving %.0f%% per 1,000 steps (predicted %.2fx, %.0f%%)\n",
               round, speedup, 100 * saving, pSpeedup, 100 * pSaving);
      table += line;
      speedups.push_back(speedup);
      jr["speedup"] = speedup;
      jr["saving"] = saving;
      jr["predicted_speedup"] = std::isnan(pSpeedup) ? json(nullptr) : json(pSpeedup);
      jr["predicted_saving"] = std::isnan(pSaving) ? json(nullptr) : json(pSaving);
    }
    out["rounds"].push_back(jr);
  }
  out["failed"] = failed;
  if (o.json) {
    printf("%s\n", out.dump(2).c_str());
  } else {
    printf("bench_compare: hetero_train (its defaults%s) under troupe sim, %.3g CPU of this "
           "machine per vCPU (%.0f CPUs for make run's %.0f vCPUs)\n\n%s",
           o.appArgs.empty() ? "" : ", plus the flags given", scale, cpusHere(), kHeteroVcpus,
           table.c_str());
    if (!speedups.empty()) {
      std::sort(speedups.begin(), speedups.end());
      printf("\nspeedup over %zu round(s): min %.2fx, max %.2fx\n", speedups.size(),
             speedups.front(), speedups.back());
    }
    printf(
        "the seeds: PyTorch MNIST example, ml.p3.2xlarge alone 1193 ms/step against + 1 x "
        "ml.c5.9xlarge 184 ms/step (6.5x, 77%% cheaper); TensorFlow example 192 -> 86 ms/step "
        "(2.2x, 46%%)\n");
    printf("predicted: the advisor's, from the other setup's run (held out)%s\n",
           temporary ? "" : ("; logs and reports in " + dir.string()).c_str());
  }
  if (temporary) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return failed ? 1 : 0;
}
