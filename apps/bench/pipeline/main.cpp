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
//
// Its parts: bench_pipeline.h.

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "bench_pipeline.h"

using namespace bench_pipeline;

namespace {

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

