// Runs summarised, the advisor's predictions and the costs at the instance table's prices
// (bench_pipeline.h).

#include <cmath>
#include <cstdio>

#include "bench_pipeline.h"
#include "prices.h"

namespace bench_pipeline {

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

double measuredCostPer1000(double stepMs, unsigned dataCount) {
  hetero_train::Prices prices;
  double perHour = prices.perHour("ml.p3.2xlarge", false).value_or(0) +
                   dataCount * prices.perHour("ml.c5.xlarge", false).value_or(0);
  return perHour * stepMs / 3600.0;
}


}  // namespace bench_pipeline
