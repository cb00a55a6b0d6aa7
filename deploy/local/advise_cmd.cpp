#include "advise_cmd.h"

#include <algorithm>
#include <cstdio>

#include "advise.h"
#include "prices.h"
#include "troupe/exit_codes.h"
#include "troupe/sched/instance_types.h"

void addAdviseOptions(CLI::App& command, AdviseOptions& o) {
  command.add_option("REPORT", o.report, "a hetero_train --report JSON file")->required();
  command.add_option("--prices", o.prices,
                     "a CSV price file (instance_type,on_demand_usd_per_hour,spot_usd_per_hour) "
                     "overriding the instance table's prices");
  command.add_option("--types", o.types,
                     "data-group instance types to consider, comma-separated (default: the "
                     "table's ml.c5 family)")
      ->delimiter(',');
  command.add_option("--max-count", o.maxCount, "data-group sizes 0..N for each type")
      ->check(CLI::Range(1u, 256u));
  command.add_flag("--json", o.json, "one JSON object instead of the table");
  command.add_option("--dnn-type", o.dnnType,
                     "what if: the trainer on this instance type (its vCPUs and price) instead of "
                     "the run's");
  command.add_option("--compute-step-ms", o.computeStepMs,
                     "what if: the trainer's compute-only step took this long on a GPU (its "
                     "steps then use no CPU of the dnn instance)")
      ->check(CLI::PositiveNumber);
  command.add_option("--cpu-scale", o.cpuScale,
                     "what if every vCPU were this much of a CPU of the run's machine (default: "
                     "the run's; 1 for a run under troupe sim's CPU budget predicts instances "
                     "whose vCPU is a whole CPU of it)")
      ->check(CLI::Range(0.001, 64.0));
}

int runAdvise(const AdviseOptions& o) {
  namespace adv = hetero_train::advise;
  try {
    hetero_train::Prices prices;
    if (!o.prices.empty()) prices = hetero_train::Prices::load(o.prices);
    auto m = adv::loadReport(o.report);
    if (!o.dnnType.empty()) {
      adv::setDnnType(m, o.dnnType);
      m.whatIf = "the trainer on 1 x " + o.dnnType + " (" + std::to_string(m.dnnVcpus) + " vCPUs)";
    }
    if (o.cpuScale > 0 && o.cpuScale != m.cpuScale) {
      char scale[64];
      snprintf(scale, sizeof(scale), "%.3g", o.cpuScale);
      m.whatIf += std::string(m.whatIf.empty() ? "" : ", ") + "every vCPU " + scale +
                  " of a CPU of the run's machine (--cpu-scale)";
      m.cpuScale = o.cpuScale;
    }
    if (o.computeStepMs > 0) {
      // The steps leave the dnn instance's CPUs: its CPU work keeps only the rest (receiving,
      // evaluating).
      if (m.trainerOnCpu) m.trainerCpuMsPerStep = std::max(0.0, m.trainerCpuMsPerStep - m.computeStepMs);
      m.computeStepMs = o.computeStepMs;
      m.trainerOnCpu = false;
      char ms[64];
      snprintf(ms, sizeof(ms), "%.1f", o.computeStepMs);
      m.whatIf += std::string(m.whatIf.empty() ? "" : ", ") + "a GPU trainer's compute-only step of " +
                  ms + " ms (--compute-step-ms)";
    }
    auto a = adv::recommend(m, adv::candidates(o.types, o.maxCount), prices);
    if (o.json) {
      printf("%s\n", adv::toJson(a).dump(2).c_str());
    } else {
      printf("%s", adv::table(a).c_str());
    }
    return 0;
  } catch (const std::invalid_argument& e) {  // AdviseError, or the price file's
    fprintf(stderr, "troupe advise: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  }
}
