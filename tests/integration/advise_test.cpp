// `troupe advise` on the report of a real, short hetero_train run: the table marks one cheapest
// and one fastest row and the run's own data group, --json carries the same rows, and bad input
// is refused naming the file or the field (docs/advisor.md).
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
