// The advisor's benches, small: bench_pipeline's sweep carries the advisor's prediction beside
// each measured step, within the loose bound docs/advisor.md's 15% sits well inside; bench_compare
// runs the job on both clusters of the seeds' table (docs/benchmarks.md). Label `bench`: not run
// under ASan, whose slowness is not a regression, nor built there.
#include <sched.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "harness.h"

using namespace std::chrono_literals;
using harness::Run;
using nlohmann::json;

TEST_CASE("bench_pipeline --json carries the advisor's predicted step beside the measured one",
          "[bench][advise]") {
  cpu_set_t set;
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  const int cpus = CPU_COUNT(&set);
  if (cpus < 2) {
    WARN("skipping: bench_pipeline pins two instances to two CPUs; this process may use "
         << CPU_COUNT(&set));
    return;
  }
  // A small sweep: no data group and one data instance, each predicted from the other's run.
  Run bench({BENCH_PIPELINE, "--sweep-data-instances", "0,1", "--predict-from", "1", "--rounds",
             "1", "--train-samples", "6000", "--blur", "9", "--json", "--troupe",
             harness::troupeBinary(), "--app", HETERO_TRAIN});
  REQUIRE(bench.wait(240s) == 0);
  INFO(bench.output());
  auto out = bench.output();
  auto j = json::parse(out.substr(out.rfind("\n{") + 1));
  REQUIRE(j["setups"].size() == 2);
  double load =
      std::max(j["load_average"]["before"].get<double>(), j["load_average"]["after"].get<double>());
  for (auto& s : j["setups"]) {
    CHECK(s["measured_step_ms"].get<double>() > 0);
    CHECK(s["predicted_step_ms"].get<double>() > 0);
    // Every row held out: the base run's own row is predicted from the other size's run.
    CHECK(s["predicted_from_data_instances"] != s["data_instances"]);
    CHECK(s["held_out"] == true);
    CHECK(s["samples_per_s"].get<double>() ==
          Approx(1000.0 * 128 / s["measured_step_ms"].get<double>()));
    CHECK(s["error"].get<double>() ==
          Approx(s["predicted_step_ms"].get<double>() / s["measured_step_ms"].get<double>() - 1));
    // docs/advisor.md: within 15% on a quiet machine (32 of 34). Here, loose: within a factor
    // of two either way, so a model that is broken (a wrong sign, a lost term) fails, while a
    // busy machine's jitter does not (make test's own two jobs load this VM 2-4). Loaded past
    // twice its CPUs (other work took most of the runs' time, which the model knows nothing of)
    // the bound says nothing: the test is a skip then, not a pass.
    double ratio = s["predicted_step_ms"].get<double>() / s["measured_step_ms"].get<double>();
    INFO("predicted/measured " << ratio << ", load average " << load << " on " << cpus << " CPUs");
    if (load <= 2 * cpus) CHECK(std::fabs(std::log(ratio)) < std::log(2.0));
  }
  if (load > 2 * cpus) {
    WARN("skipping: the advisor's bound: load average " << load << " on " << cpus
                                                        << " CPUs, past twice them");
  }
  CHECK(j["per_blur"][0]["recommended_data_instances"].is_number());
  CHECK(j.contains("targets_met"));
}

TEST_CASE("bench_compare runs the job on both clusters and prints the seeds' table, held out",
          "[bench][advise]") {
  // make compare, small: one round of a 3,000-sample epoch, the light preset.
  Run bench({BENCH_COMPARE, "--json", "--troupe", harness::troupeBinary(), "--app", HETERO_TRAIN,
             "--", "--train-samples", "3000", "--epochs", "1", "--augment", "light"});
  REQUIRE(bench.wait(240s) == 0);
  INFO(bench.output());
  auto out = bench.output();
  auto j = json::parse(out.substr(out.rfind("\n{") + 1));
  CHECK(j["failed"] == false);
  REQUIRE(j["rounds"].size() == 1);
  auto& r = j["rounds"][0];
  for (auto setup : {"homogeneous", "heterogeneous"}) {
    INFO(setup);
    REQUIRE(r.contains(setup));
    CHECK(r[setup]["exit"] == 0);
    CHECK(r[setup]["step_ms"].get<double>() > 0);
    CHECK(r[setup]["predicted_step_ms"].get<double>() > 0);
    CHECK(r[setup]["cost_per_1000_steps_usd"].get<double>() ==
          Approx(r[setup]["price_per_hour_usd"].get<double>() * r[setup]["step_ms"].get<double>() /
                 3600)
              .epsilon(0.05));
  }
  CHECK(r["homogeneous"]["price_per_hour_usd"].get<double>() == Approx(3.825));
  CHECK(r["heterogeneous"]["price_per_hour_usd"].get<double>() == Approx(3.825 + 2 * 0.204));
  CHECK(r["speedup"].get<double>() ==
        Approx(r["homogeneous"]["step_ms"].get<double>() / r["heterogeneous"]["step_ms"].get<double>()));

  // A run that fails is reported and fails the bench: an app flag hetero_train refuses.
  Run broken({BENCH_COMPARE, "--json", "--troupe", harness::troupeBinary(), "--app", HETERO_TRAIN,
              "--", "--batch-size", "0"});
  CHECK(broken.wait(120s) == 1);
  auto bad = broken.output();
  CHECK(bad.find("troupe sim exited 2") != std::string::npos);
}
