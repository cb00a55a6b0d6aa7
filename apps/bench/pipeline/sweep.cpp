// --sweep-blur / --sweep-data-instances (bench_pipeline.h).

#include <cmath>
#include <cstdio>

#include "bench_pipeline.h"

namespace bench_pipeline {

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


}  // namespace bench_pipeline
