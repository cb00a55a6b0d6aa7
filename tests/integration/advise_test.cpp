// `troupe advise` on the report of a real, short hetero_train run: the table marks one cheapest
// and one fastest row and the run's own data group, --json carries the same rows, and bad input
// is refused naming the file or the field (docs/advisor.md).
#include <sched.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using nlohmann::json;
using train_job::kCluster;
using train_job::tempPath;
using train_job::train;

TEST_CASE("troupe advise sizes the data group from a real hetero_train report",
          "[train][advise]") {
  auto report = tempPath("advise-report.json");
  Run job(harness::sim(kCluster, train({"--epochs", "1", "--train-samples", "3000", "--report",
                                        report})));
  REQUIRE(job.wait(180s) == 0);
  INFO(job.output());
  // hetero_train prints the advice at the end and stores it, with its inputs, in the report.
  CHECK(job.output().find("sizing advice") != std::string::npos);
  json j;
  {
    std::ifstream in(report);
    REQUIRE(in.good());
    j = json::parse(in);
  }
  REQUIRE(j["rates"].is_object());
  CHECK(j["rates"]["augment_images_per_vcpu_second"].get<double>() > 0);
  CHECK(j["rates"]["compute_step_ms"].get<double>() > 0);
  CHECK(j["advice"]["rows"].size() > 1);

  std::vector<std::string> advise = {harness::troupeBinary(), "advise", report, "--types",
                                     "ml.c5.xlarge,ml.c5.9xlarge", "--max-count", "3"};
  {
    Run table(advise);
    REQUIRE(table.wait(30s) == 0);
    auto out = table.output();
    INFO(out);
    CHECK(harness::count(out, " cheapest") == 1);
    CHECK(harness::count(out, " fastest") == 1);
    CHECK(harness::count(out, "(measured: ") == 1);  // the run's 2 x ml.c5.xlarge
    CHECK(out.find("the model assumes") != std::string::npos);
  }
  {
    advise.push_back("--json");
    Run asJson(advise);
    REQUIRE(asJson.wait(30s) == 0);
    auto out = json::parse(asJson.output());
    REQUIRE(out["rows"].size() == 7);  // none, then 1..3 of each type
    int cheapest = 0, fastest = 0;
    for (auto& r : out["rows"]) {
      cheapest += r["cheapest"].get<bool>();
      fastest += r["fastest"].get<bool>();
      if (r["measured"].get<bool>()) {
        CHECK(r["data_type"] == "ml.c5.xlarge");
        CHECK(r["data_count"] == 2);
      }
      CHECK(r["step_ms"].get<double>() > 0);
    }
    CHECK(cheapest == 1);
    CHECK(fastest == 1);
    CHECK(out["measured"]["data_count"] == 2);
  }
  {
    // A report from before the advisor (no 'rates'): refused, naming the field and the fix.
    auto old = tempPath("advise-old.json");
    j.erase("rates");
    std::ofstream(old) << j.dump();
    Run refused({harness::troupeBinary(), "advise", old});
    CHECK(refused.wait(30s) == 2);
    CHECK(refused.output().find("no 'rates'") != std::string::npos);
    CHECK(refused.output().find("hetero_train --report") != std::string::npos);
    unlink(old.c_str());
  }
  {
    Run missing({harness::troupeBinary(), "advise", "/nonexistent/report.json"});
    CHECK(missing.wait(30s) == 2);
    CHECK(missing.output().find("report '/nonexistent/report.json' cannot be read") !=
          std::string::npos);
  }
  {
    Run badType({harness::troupeBinary(), "advise", report, "--types", "ml.c5.huge"});
    CHECK(badType.wait(30s) == 2);
    CHECK(badType.output().find("'ml.c5.huge' is not in troupe's instance table") !=
          std::string::npos);
  }
  unlink(report.c_str());
}

TEST_CASE("bench_pipeline --json carries the advisor's predicted step beside the measured one",
          "[train][advise]") {
  cpu_set_t set;
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  if (CPU_COUNT(&set) < 2) {
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
  }
  CHECK(j["per_blur"][0]["recommended_data_instances"].is_number());
  CHECK(j.contains("targets_met"));
}

TEST_CASE("bench_compare runs the job on both clusters and prints the seeds' table, held out",
          "[train][advise]") {
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
