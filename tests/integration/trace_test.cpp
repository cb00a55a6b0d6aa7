// The merged timeline (--trace, docs/tracing.md): a 3-instance hetero_train job under `troupe sim`
// writes one Chrome trace-event file with every host's rows, on the head's clock; a host lost on
// the way is named as missing, and the trace changes neither the job's outcome nor its end.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using nlohmann::json;
using train_job::kCluster;
using train_job::tempPath;
using train_job::train;

namespace {

json readTrace(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

// Chrome's trace-event format: what every event must carry for Perfetto to place it.
void checkShape(const json& trace) {
  REQUIRE(trace.contains("traceEvents"));
  REQUIRE(trace["traceEvents"].is_array());
  for (auto& e : trace["traceEvents"]) {
    INFO(e.dump());
    REQUIRE(e.contains("ph"));
    REQUIRE(e["name"].is_string());
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    if (e["ph"] == "X") {
      CHECK(e["cat"].is_string());
      REQUIRE(e["ts"].is_number());
      REQUIRE(e["dur"].is_number());
      CHECK(e["dur"].get<double>() >= 0);  // a span never ends before it starts
    } else {
      REQUIRE(e["ph"] == "M");
      if (e["name"] == "process_sort_index") {
        CHECK(e["args"]["sort_index"].is_number_integer());
      } else {
        CHECK((e["name"] == "process_name" || e["name"] == "thread_name"));
        CHECK(e["args"]["name"].is_string());
      }
    }
  }
}

struct Host {
  std::string name;                  // process_name: "algo-2 (data_group)"
  std::map<std::string, int> spans;  // by span name, and "actor" for any actor call
  double first = 1e300, last = -1e300;
};

std::map<int, Host> hostsOf(const json& trace) {
  std::map<int, Host> hosts;
  for (auto& e : trace["traceEvents"]) {
    auto& h = hosts[e["pid"].get<int>()];
    if (e["ph"] == "M" && e["name"] == "process_name") h.name = e["args"]["name"];
    if (e["ph"] != "X") continue;
    ++h.spans[e["name"].get<std::string>()];
    if (e["cat"] == "actor") ++h.spans["actor"];
    double ts = e["ts"].get<double>();
    h.first = std::min(h.first, ts);
    h.last = std::max(h.last, ts + e["dur"].get<double>());
  }
  return hosts;
}

}  // namespace

TEST_CASE("trace: a host whose clock is 1000 s ahead is aligned by its measured offset",
          "[train][trace]") {
  // On one machine every clock offset is 0, and an offset never applied, or applied with the
  // wrong sign, would pass the test above. Here the data instances run in a time namespace whose
  // monotonic clock (the one spans are recorded in) is 1000 s ahead of the head's.
  if (system("unshare --fork --time --monotonic 1 true > /dev/null 2>&1") != 0) {
    WARN("skipping: no time namespace here (unshare --time needs Linux 5.6 and root)");
    return;
  }
  auto dir = tempPath("skew");
  std::filesystem::create_directories(dir);
  auto wrapper = dir + "/skewed";
  std::ofstream(wrapper) << "#!/bin/bash\n"
                            "# The app, its monotonic clock SKEW_SECONDS ahead when that is set.\n"
                            "if [[ -n ${SKEW_SECONDS:-} ]]; then\n"
                            "  export TROUPE_DIE_WITH_PARENT=$$  # unshare, the app's parent\n"
                            "  exec unshare --fork --kill-child --time --monotonic \"$SKEW_SECONDS\" "
                            "-- \"$@\"\n"
                            "fi\n"
                            "exec \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  auto path = tempPath("skewed-trace.json");
  auto simArgs = kCluster;
  simArgs.insert(simArgs.end(), {"--trace", path, "--env", "data_group:SKEW_SECONDS=1000"});
  auto app = train({"--epochs", "1", "--train-samples", "6000", "--augmenters-per-node", "2"});
  app.insert(app.begin(), wrapper);
  Run run(harness::sim(simArgs, app));
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  REQUIRE(code == 0);
  auto trace = readTrace(path);
  auto& meta = trace["otherData"]["troupe"];
  REQUIRE(meta["hosts"].size() == 3);
  int skewed = 0;
  for (auto& h : meta["hosts"]) {
    INFO(h.dump());
    auto offset = h["clock_offset_us"].get<int64_t>();
    bool data = h.dump().find("data_group") != std::string::npos;
    // The node's clock minus the head's: +1000 s for a data instance, within a second.
    CHECK(std::llabs(offset - (data ? 1000000000 : 0)) < 1000000);
    skewed += data ? 1 : 0;
  }
  CHECK(skewed == 2);
  // Aligned, the three hosts' activity overlaps as on one clock; unaligned (or aligned the wrong
  // way) the data hosts' spans would sit 1000 s (or 2000 s) away from the head's.
  double latestStart = -1e300, earliestEnd = 1e300;
  for (auto& [pid, h] : hostsOf(trace)) {
    latestStart = std::max(latestStart, h.first);
    earliestEnd = std::min(earliestEnd, h.last);
  }
  CHECK(latestStart < earliestEnd);
  std::filesystem::remove_all(dir);
  CHECK(run.leftovers().empty());
}

TEST_CASE("trace: one file with every host's rows, spans and aligned clocks", "[train][trace]") {
  auto path = tempPath("trace.json");
  auto simArgs = kCluster;
  simArgs.insert(simArgs.end(), {"--trace", path});
  Run run(harness::sim(
      simArgs, train({"--epochs", "1", "--train-samples", "6000", "--augmenters-per-node", "2"})));
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);  // the trace does not change the job's outcome
  auto trace = readTrace(path);
  checkShape(trace);

  auto hosts = hostsOf(trace);
  REQUIRE(hosts.size() == 3);  // one process row per host
  double latestStart = -1e300, earliestEnd = 1e300;
  for (auto& [pid, h] : hosts) {
    INFO("pid " << pid << ": " << h.name);
    CHECK(!h.name.empty());       // the metadata names every process
    CHECK(h.spans["actor"] > 0);  // every host's actor calls
    if (h.name.find("(dnn_group)") != std::string::npos) {
      CHECK(h.spans["step"] > 0);
      CHECK(h.spans["train"] == 1);  // the trainer's train() call
    } else {
      CHECK(h.name.find("(data_group)") != std::string::npos);
      CHECK(h.spans["augment"] > 0);
      CHECK(h.spans["push"] > 0);  // the BatchSink stream
    }
    latestStart = std::max(latestStart, h.first);
    earliestEnd = std::min(earliestEnd, h.last);
  }
  // On one clock, the three hosts' activity overlaps: every host ran while the others did. A node
  // whose spans kept its own clock's origin would sit apart by its process's uptime.
  CHECK(latestStart < earliestEnd);

  auto& meta = trace["otherData"]["troupe"];
  CHECK(meta["missing_hosts"].empty());
  CHECK(meta["dropped_spans"] == 0);
  REQUIRE(meta["hosts"].size() == 3);
  for (auto& h : meta["hosts"]) {
    INFO(h.dump());
    CHECK(h["complete"] == true);
    CHECK(h["clock_offset_us"].is_number_integer());  // measured, not assumed
    CHECK(h["clock_uncertainty_us"].get<int64_t>() >= 0);
  }
  CHECK(run.leftovers().empty());
  unlink(path.c_str());
}

TEST_CASE("trace: a data instance killed mid-job is named missing, and the job still completes",
          "[train][trace][fault]") {
  auto path = tempPath("trace-lost.json");
  auto simArgs = kCluster;
  simArgs.insert(simArgs.end(), {"--trace", path});
  Run run(harness::sim(simArgs, train({"--epochs", "2", "--train-samples", "12000",
                                       "--augmenters-per-node", "2", "--progress-every", "0.2"})));
  train_job::waitPastFirstStep(run, 2, 60s);
  auto killed = harness::instanceIn(run, "data_group");
  REQUIRE(kill(killed.pid, SIGKILL) == 0);
  auto victim = killed.host;
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  // Lost capacity degrades the job, and the trace does not change that.
  CHECK(harness::headDoneHostKilled(code, out));
  auto trace = readTrace(path);
  checkShape(trace);
  auto& missing = trace["otherData"]["troupe"]["missing_hosts"];
  REQUIRE(missing.size() == 1);
  CHECK(missing[0]["host"] == victim);
  CHECK(missing[0]["why"].get<std::string>().find("lost") != std::string::npos);
  CHECK(hostsOf(trace).size() == 3);  // the lost host still has its (empty) process row
  CHECK(run.leftovers().empty());
  unlink(path.c_str());
}

TEST_CASE("trace: a --trace file in a folder that does not exist is refused before the job starts",
          "[train][trace][bad-input]") {
  Run run(harness::sim(kCluster, train({"--trace", "/nonexistent-folder/trace.json"})));
  int code = run.wait(60s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 2);  // CONFIG_ERROR (docs/exit-codes.md)
  CHECK(out.find("--trace (TROUPE_TRACE) '/nonexistent-folder/trace.json': cannot write it") !=
        std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("trace: an actor method that held its node's event loop is a stall span named after it",
          "[train][trace][control]") {
  // docs/lifecycle.md, "Who holds the loop": one actor on the head and one on a data node each
  // spin 400 ms in one method body (--stall-warn-ms is 200).
  auto path = tempPath("stall-trace.json");
  auto simArgs = kCluster;
  simArgs.insert(simArgs.end(), {"--trace", path});
  Run run(harness::sim(simArgs, {harness::probeApp(), "--scenario", "stall", "--hold-ms", "400"}));
  CHECK(run.wait(60s) == 0);
  INFO(run.output());
  auto trace = readTrace(path);
  checkShape(trace);
  std::set<int> pids;
  int stalls = 0;
  for (auto& e : trace["traceEvents"]) {
    if (!e.contains("cat") || e["cat"] != "stall") continue;
    ++stalls;
    CHECK(e["name"] == "Probe.work");
    CHECK(e["dur"].get<double>() >= 390'000);  // microseconds
    pids.insert(e["pid"].get<int>());
  }
  CHECK(stalls == 2);
  CHECK(pids.size() == 2);  // one on each node's rows
  std::remove(path.c_str());
}

