// The sizing advisor's model (deploy/advise/advise.h): known inputs give known predictions,
// the cheapest and fastest rows are the right ones, and a report without what the model needs is
// refused naming the field.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "advise.h"

using namespace hetero_train;
using namespace hetero_train::advise;
using nlohmann::json;

namespace {

// One vCPU augments 1,000 images/s: a batch of 100 takes 100 ms on one vCPU. The CPU trainer's
// step is 50 ms, evaluation 10 ms per step, and its process uses 60 ms of CPU per step in all; the
// dnn instance has 1 vCPU (as bench_pipeline pins). No wait for an epoch's first batch.
Measured known() {
  Measured m;
  m.augmentImagesPerVcpuSecond = 1000;
  m.computeStepMs = 50;
  m.otherMsPerStep = 10;
  m.trainerCpuMsPerStep = 60;
  m.stepsPerEpoch = 100;
  m.streamBytesPerSecond = 1e9;
  m.bytesPerBatch = 100 * 784 * 4;
  m.batchSize = 100;
  m.trainerOnCpu = true;
  m.dnnType = "ml.p3.2xlarge";
  m.dnnCount = 1;
  m.dnnVcpus = 1;
  m.measuredStepMs = 160;
  return m;
}

json reportJson() {
  return {{"rates",
           {{"augment_images_per_vcpu_second", 1000.0},
            {"compute_step_ms", 50.0},
            {"other_ms_per_step", 10.0},
            {"trainer_cpu_ms_per_step", 60.0},
            {"fill_ms_per_epoch", 0.0},
            {"steps_per_epoch", 100.0},
            {"load_ms_per_augmenter", 200.0},
            {"epochs", 2},
            {"stream_bytes_per_s", 1e9},
            {"bytes_per_batch", 313600.0},
            {"batch_size", 100},
            {"trainer_on_cpu", true},
            {"augmenters_per_node", 1},
            {"dnn_group", "dnn_group"},
            {"data_group", "data_group"}}},
          {"instances",
           {{{"host", "algo-1"}, {"group", "dnn_group"}, {"instance_type", "ml.p3.2xlarge"},
             {"vcpus", 1}},
            {{"host", "algo-2"}, {"group", "data_group"}, {"instance_type", "ml.c5.xlarge"},
             {"vcpus", 1}}}},
          {"mean_step_ms", 62.0},
          {"data_wait_fraction", 0.01},
          {"pricing", "on-demand"}};
}

}  // namespace

TEST_CASE("advisor: no data group on a 1-vCPU dnn instance costs augmentation plus the step",
          "[advise]") {
  auto r = predict(known(), {"", 0, 0}, Prices());
  // Augmentation (100 ms) and the trainer process's work (60 ms: its step and evaluation) share
  // the one vCPU; the trainer waits while the vCPU augments.
  CHECK(r.stepMs == Approx(160));
  CHECK(r.trainerMs == Approx(60));
  CHECK(r.waitShare == Approx(100.0 / 160));
  CHECK(r.pricePerHour == Approx(3.825));
  CHECK(r.costPer1000 == Approx(3.825 * 160 / 3600));
  CHECK_FALSE(r.beyondStream);
}

TEST_CASE("advisor: under troupe sim's CPU budget a vCPU is the report's scale of a CPU",
          "[advise]") {
  auto m = known();
  m.augmentImagesPerVcpuSecond = 200;  // 500 ms per batch on one CPU
  m.cpuScale = 0.125;                  // 2 CPUs for 16 vCPUs
  // 4 vCPUs are half a CPU: 1,000 ms per batch; 2 instances, one CPU: 500 ms.
  CHECK(predict(m, {"ml.c5.xlarge", 1, 4}, Prices()).dataMs == Approx(1000));
  CHECK(predict(m, {"ml.c5.xlarge", 2, 4}, Prices()).dataMs == Approx(500));
  m.cpuScale = 1;
  CHECK(predict(m, {"ml.c5.xlarge", 2, 4}, Prices()).dataMs == Approx(62.5));
  // The report carries it; one without (before the budget) means a whole CPU.
  nlohmann::json report = {{"rates",
                            {{"augment_images_per_vcpu_second", 1000}, {"compute_step_ms", 5},
                             {"other_ms_per_step", 0}, {"trainer_cpu_ms_per_step", 5},
                             {"fill_ms_per_epoch", 0}, {"steps_per_epoch", 10},
                             {"load_ms_per_augmenter", 0}, {"epochs", 1},
                             {"stream_bytes_per_s", 1e6}, {"bytes_per_batch", 1e5},
                             {"batch_size", 128}, {"trainer_on_cpu", true},
                             {"augmenters_per_node", 0}, {"dnn_group", "dnn_group"},
                             {"data_group", "data_group"}, {"cpu_scale", 0.125}}},
                           {"instances",
                            {{{"group", "dnn_group"}, {"instance_type", "ml.p3.2xlarge"},
                              {"vcpus", 8}}}},
                           {"mean_step_ms", 10},
                           {"data_wait_fraction", 0.5}};
  CHECK(hetero_train::advise::fromReport(report).cpuScale == Approx(0.125));
  report["rates"].erase("cpu_scale");
  CHECK(hetero_train::advise::fromReport(report).cpuScale == Approx(1));
}

TEST_CASE("advisor: a data group scales augmentation with its vCPUs until the step is the limit",
          "[advise]") {
  auto m = known();
  m.augmentImagesPerVcpuSecond = 200;  // 500 ms per batch on one vCPU
  auto c5 = [&](unsigned n) { return predict(m, {"ml.c5.xlarge", n, 4}, Prices()); };
  CHECK(c5(1).dataMs == Approx(125));
  CHECK(c5(1).stepMs == Approx(125));  // evaluation overlaps the augmenters' work
  CHECK(c5(1).waitShare == Approx(65.0 / 125));
  CHECK(c5(2).stepMs == Approx(62.5));
  CHECK(c5(3).stepMs == Approx(60));  // 41.7 ms of data: the trainer's 60 ms is the limit
  CHECK(c5(3).waitShare == Approx(0));
  // The trainer process's CPU work beyond its serial steps bounds it on a small dnn instance.
  auto busy = m;
  busy.trainerCpuMsPerStep = 90;
  CHECK(predict(busy, {"ml.c5.xlarge", 4, 4}, Prices()).stepMs == Approx(90));
  busy.dnnVcpus = 2;
  CHECK(predict(busy, {"ml.c5.xlarge", 4, 4}, Prices()).stepMs == Approx(60));
  CHECK(c5(3).costPer1000 == Approx((3.825 + 3 * 0.204) * 60 / 3600));
  // --augmenters-per-node 1: a node augments on one vCPU whatever its size.
  m.augmentersPerNode = 1;
  CHECK(predict(m, {"ml.c5.xlarge", 2, 4}, Prices()).dataMs == Approx(250));
}

TEST_CASE("advisor: each epoch's wait for its first batch is added to every candidate's step",
          "[advise]") {
  auto m = known();
  m.fillMsPerEpoch = 500;  // 5 ms per step over 100 steps
  auto none = predict(m, {"", 0, 0}, Prices());
  CHECK(none.stepMs == Approx(165));
  CHECK(none.waitShare == Approx(105.0 / 165));
  auto two = predict(m, {"ml.c5.xlarge", 2, 4}, Prices());
  CHECK(two.stepMs == Approx(65));
  CHECK(two.waitShare == Approx(5.0 / 65));
  // Loading the shards (400 ms of CPU, once in 2 epochs) on instances of a quarter CPU takes 4
  // times as long as on the run's whole one: 3 x 400 / 2 = 600 ms more per epoch, 6 ms a step.
  m.loadMsPerAugmenter = 400;
  m.epochs = 2;
  auto quarter = predict(m, {"ml.c5.xlarge", 4, 0.25}, Prices());
  CHECK(quarter.dataMs == Approx(100));
  CHECK(quarter.stepMs == Approx(100 + 5 + 6));
  // Measured on quarter-CPU data instances, predicted for whole ones: that much less.
  m.dataCount = 4;
  m.dataVcpus = 0.25;
  m.fillMsPerEpoch = 1100;
  CHECK(predict(m, {"ml.c5.xlarge", 4, 1}, Prices()).stepMs == Approx(60 + 5));
}

TEST_CASE("advisor: the cheapest and the fastest are marked, ties to the smaller group",
          "[advise]") {
  auto m = known();
  m.augmentImagesPerVcpuSecond = 200;
  auto a = recommend(m, candidates({"ml.c5.xlarge"}, 4), Prices());
  REQUIRE(a.rows.size() == 5);  // none, 1..4
  int cheapest = 0, fastest = 0;
  for (auto& r : a.rows) {
    cheapest += r.cheapest;
    fastest += r.fastest;
  }
  CHECK(cheapest == 1);
  CHECK(fastest == 1);
  // 3 and 4 instances both reach the trainer's 60 ms: the fastest is the smaller. Two instances
  // (62.5 ms at $4.233/h) cost less per step than three (60 ms at $4.437/h): the cheapest.
  CHECK(a.rows[3].candidate.count == 3);
  CHECK(a.rows[3].fastest);
  CHECK_FALSE(a.rows[4].fastest);
  CHECK(a.rows[2].cheapest);
  // With the data instance 100 times dearer, running without a data group is cheapest.
  auto path = "/tmp/advise-test-" + std::to_string(getpid()) + ".csv";
  std::ofstream(path) << "instance_type,on_demand_usd_per_hour\nml.c5.xlarge,20.4\n";
  auto dear = recommend(m, candidates({"ml.c5.xlarge"}, 4), Prices::load(path));
  unlink(path.c_str());
  CHECK(dear.rows[0].cheapest);
  CHECK(dear.rows[3].fastest);
}

TEST_CASE("advisor: a row needing more stream bytes/s than measured is marked", "[advise]") {
  auto m = known();
  m.augmentImagesPerVcpuSecond = 800;                // 125 ms per batch on one vCPU
  m.streamBytesPerSecond = m.bytesPerBatch / 0.185;  // the run moved one batch per 185 ms
  // Up to 1.5 times the run's bytes/s is taken as shown by the run.
  CHECK(predict(m, {"ml.c5.xlarge", 4, 4}, Prices()).beyondStream);        // one per 60 ms
  CHECK_FALSE(predict(m, {"ml.c5.xlarge", 1, 1}, Prices()).beyondStream);  // one per 125 ms
  CHECK_FALSE(predict(m, {"", 0, 0}, Prices()).beyondStream);              // one per 185 ms
}

TEST_CASE("advisor: spot pricing without a spot price counts the row as unpriced", "[advise]") {
  auto m = known();
  m.spot = true;
  auto a = recommend(m, candidates({"ml.c5.xlarge"}, 1), Prices());
  for (auto& r : a.rows) {
    CHECK_FALSE(r.priced);
    CHECK_FALSE(r.cheapest);
  }
  CHECK(table(a).find("no price for an instance") != std::string::npos);
}

TEST_CASE("advisor: a report's rates and instances are read, the measured row marked",
          "[advise]") {
  auto m = fromReport(reportJson());
  CHECK(m.augmentImagesPerVcpuSecond == 1000);
  CHECK(m.dnnType == "ml.p3.2xlarge");
  CHECK(m.dnnVcpus == 1);
  CHECK(m.dataType == "ml.c5.xlarge");
  CHECK(m.dataCount == 1);
  CHECK(m.augmentersPerNode == 1);
  auto a = recommend(m, candidates({"ml.c5.xlarge"}, 2), Prices());
  CHECK(a.rows[1].measured);
  CHECK_FALSE(a.rows[0].measured);
  auto j = toJson(a);
  CHECK(j["rows"].size() == 3);
  CHECK(j["assumptions"].size() >= 5);
  CHECK(table(a).find("the model assumes") != std::string::npos);
}

TEST_CASE("advisor: a report without a field it needs is refused naming the field", "[advise]") {
  auto without = [](const std::string& key) {
    auto j = reportJson();
    j["rates"].erase(key);
    return j;
  };
  auto message = [](const json& j) {
    try {
      fromReport(j);
    } catch (const AdviseError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(message(without("compute_step_ms")),
             Catch::Contains("no 'rates.compute_step_ms'") && Catch::Contains("hetero_train"));
  auto noRates = reportJson();
  noRates.erase("rates");
  CHECK_THAT(message(noRates), Catch::Contains("no 'rates'"));
  auto negative = reportJson();
  negative["rates"]["augment_images_per_vcpu_second"] = -3;
  CHECK_THAT(message(negative), Catch::Contains("'rates.augment_images_per_vcpu_second' is -3"));
  auto noVcpus = reportJson();
  noVcpus["instances"][1].erase("vcpus");
  CHECK_THAT(message(noVcpus), Catch::Contains("no 'instances[1].vcpus'"));
  CHECK_THROWS_WITH(loadReport("/nonexistent/report.json"),
                    Catch::Contains("'/nonexistent/report.json' cannot be read"));
  CHECK_THROWS_WITH(candidates({"ml.c5.huge"}, 2), Catch::Contains("'ml.c5.huge' is not in"));
}
