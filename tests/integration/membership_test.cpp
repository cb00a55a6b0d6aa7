// Elastic membership (docs/lifecycle.md, "Membership"): a data instance that starts late joins the
// running job and gets augmenters; a host the cluster description does not name joins its group;
// bad --start-with values are refused. Drains, rejoins after kill -9 and after a healed partition
// are fault cases (tests/faults).
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "temp_dir.h"
#include "train_job.h"

using namespace std::chrono_literals;
using harness::Run;
using train_job::tempPath;
using train_job::train;

TEST_CASE("a data instance that starts late joins the running job and gets augmenters",
          "[train][membership]") {
  // Seed 5 deals algo-1 and algo-3 to data_group and algo-2 to dnn_group (checked below).
  auto report = tempPath("late.json");
  auto samples = train_job::longJobSamples();
  Run run(harness::sim({"--seed", "5", "--group", "data_group=2:ml.c5.xlarge", "--group",
                        "dnn_group=1:ml.p3.2xlarge", "--start-late", "algo-3=2000",
                        // counted from the first progress line: inside training on any machine
                        "--start-late-after", "progress: epoch 1/5"},
                       train({"--start-with", "data_group=1", "--progress-every", "0.5",
                              "--train-samples", std::to_string(samples), "--report", report})));
  int code = run.wait(300s);
  auto out = run.output();
  INFO(out);
  REQUIRE(out.find("algo-3   data_group   ml.c5.xlarge") != std::string::npos);
  CHECK(code == 0);
  CHECK(out.find("troupe sim: all 3 instances exited 0") != std::string::npos);
  // It trained with algo-1 alone first, then with both.
  auto started = out.find("starting without algo-3 (data_group) (--start-with)");
  auto joined = out.find("membership: algo-3 (data_group) joined the running job");
  auto placed = out.find("4 augmenters placed on algo-3 as it joined the job");
  CHECK(started != std::string::npos);
  CHECK(joined != std::string::npos);
  CHECK(placed != std::string::npos);
  CHECK(started < joined);
  CHECK(out.find("] progress: epoch 1/5") < joined);
  auto j = train_job::checkEverySampleOnce(report, 5, samples);
  CHECK(j["membership"].size() == 1);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a host the cluster description does not name joins its group as a new member",
          "[train][membership]") {
  auto report = tempPath("scale-up.json");
  auto samples = train_job::longJobSamples();
  Run run(harness::sim({"--group", "data_group=1:ml.c5.xlarge", "--group",
                        "dnn_group=1:ml.p3.2xlarge", "--scale-up", "data_group=1@3000"},
                       train({"--train-samples", std::to_string(samples), "--report", report})));
  int code = run.wait(300s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("algo-3 (data_group) is a new member of its group") != std::string::npos);
  // It got augmenters: as it joined the running job, or, where the driver started later than 3 s
  // (a loaded machine: the training set read slowly), in the first placement, its table's rows.
  bool asJoined = out.find("4 augmenters placed on algo-3 as it joined the job") != std::string::npos;
  std::smatch m;
  bool atStart = std::regex_search(out, m, std::regex(R"(augmenter-\d+ +train\.Augmenter +algo-3)"));
  if (!asJoined) WARN("algo-3 joined before the driver placed its augmenters: placed with the rest");
  CHECK((asJoined || atStart));
  CHECK(out.find("troupe sim: all 3 instances exited 0") != std::string::npos);
  train_job::checkEverySampleOnce(report, 5, samples);
  CHECK(run.leftovers().empty());
}

TEST_CASE("bad membership settings are refused, naming the setting and the value",
          "[train][membership][bad-input]") {
  SECTION("a group the cluster does not have") {
    Run run(harness::sim(train_job::kCluster, train({"--start-with", "cpu_group=1"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--start-with 'cpu_group=1': the cluster has no group 'cpu_group'; "
                            "its groups are data_group, dnn_group") != std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("more nodes than the group has") {
    Run run(harness::sim(train_job::kCluster, train({"--start-with", "data_group=3"})));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--start-with 'data_group=3': N must be a number from 0 to 2") !=
          std::string::npos);
    CHECK(run.leftovers().empty());
  }
  SECTION("troupe sim: --start-late names a host it does not have") {
    Run run(harness::sim({"--group", "a=1", "--start-late", "algo-9=100"}, {"/bin/true"}));
    REQUIRE(run.wait(30s) == 2);
    CHECK(
        run.output().find("--start-late 'algo-9=100': no host or group 'algo-9' in this cluster") !=
        std::string::npos);
  }
  SECTION("troupe sim: --start-late asks for more instances than a group has") {
    Run run(harness::sim({"--group", "a=2", "--start-late", "a:3=100"}, {"/bin/true"}));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--start-late 'a:3=100': N must be a number from 1 to 2 (the "
                            "instances of group 'a')") != std::string::npos);
  }
  SECTION("troupe sim: --scale-up names a group it does not have") {
    Run run(harness::sim({"--group", "a=1", "--scale-up", "b=1@100"}, {"/bin/true"}));
    REQUIRE(run.wait(30s) == 2);
    CHECK(run.output().find("--scale-up 'b=1@100': no group 'b' in this cluster") !=
          std::string::npos);
  }
}

TEST_CASE("troupe sim --start-late-after counts the delay from a line, and a moment that never "
          "comes starts nothing",
          "[train][membership]") {
  // algo-1 says it is the head (its role file), prints the moment after 1.5 s and ends 1 s
  // later; algo-2 starts 300 ms after the moment. Then the same with a moment never printed.
  auto app = [](const std::string& moment) -> std::vector<std::string> {
    return {"/bin/sh", "-c",
            "if [ \"$(basename \"$TROUPE_SM_ROOT\")\" = algo-1 ]; then echo head > "
            "\"$TROUPE_ROLE_FILE\"; sleep 1.5; echo " + moment + "; sleep 1; else echo "
            "LATE-STARTED; fi"};
  };
  std::vector<std::string> late = {"--group",      "a=2",        "--linger-ms",
                                   "500",          "--start-late", "algo-2=300",
                                   "--start-late-after", "THE-MOMENT"};
  Run run(harness::sim(late, app("THE-MOMENT")));
  CHECK(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  auto moment = out.find("[algo-1] THE-MOMENT");
  auto started = out.find("troupe sim: starting algo-2 (a), 300 ms late (--start-late)");
  auto seen = out.find("--start-late-after: 'THE-MOMENT' seen: the late starts' clock starts");
  auto said = out.find("[algo-2] LATE-STARTED");
  REQUIRE(moment != std::string::npos);
  REQUIRE(started != std::string::npos);
  CHECK(out.find("starts in 300 ms after a line with 'THE-MOMENT'") < moment);
  CHECK((seen != std::string::npos && seen > moment));
  CHECK(started > moment);
  CHECK((said != std::string::npos && said > started));

  Run never(harness::sim(late, app("SOMETHING-ELSE")));
  CHECK(never.wait(30s) == 0);
  auto text = never.output();
  INFO(text);
  CHECK(text.find("troupe sim: algo-2 (a) was never started: the job ended first") !=
        std::string::npos);
  CHECK(text.find("LATE-STARTED") == std::string::npos);
}

namespace {

// A running process's environment (/proc/PID/environ), as KEY=VALUE strings.
std::vector<std::string> environOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> out;
  std::string item;
  while (std::getline(in, item, '\0')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The same instance started a second time, as a per-instance entry point would start it again:
// its environment (without the sim's die-with-parent link, whose parent would be this test) and
// TROUPE_INCARNATION. The first process still holds its port on this machine, so the second one
// listens on another (a host map of its own): a process started on a replacement machine.
std::vector<std::string> twinEnv(pid_t pid, const std::string& host, int incarnation,
                                 const std::string& mapFile) {
  std::vector<std::string> env;
  for (auto& e : environOf(pid)) {
    if (e.rfind("TROUPE_DIE_WITH_PARENT=", 0) == 0 || e.rfind("TROUPE_INCARNATION=", 0) == 0) {
      continue;
    }
    if (e.rfind("TROUPE_HOST_MAP=", 0) == 0) {
      std::ifstream in(e.substr(strlen("TROUPE_HOST_MAP=")));
      auto map = nlohmann::json::parse(in);
      map[host] = "127.0.0.1:" + std::to_string(harness::freePort());
      std::ofstream(mapFile) << map.dump();
      env.push_back("TROUPE_HOST_MAP=" + mapFile);
      continue;
    }
    if (e.rfind("TROUPE_", 0) == 0) env.push_back(e);
  }
  env.push_back("TROUPE_INCARNATION=" + std::to_string(incarnation));
  return env;
}

}  // namespace

TEST_CASE(
    "a second process of a live host: the same incarnation is refused, a higher one "
    "replaces it",
    "[train][membership]") {
  auto report = tempPath("twin.json");
  auto samples = train_job::longJobSamples();
  Run run(harness::sim(train_job::kCluster,
                       train({"--progress-every", "0.5", "--train-samples",
                              std::to_string(samples), "--report", report})));
  REQUIRE_OUTPUT(run, "progress: epoch 1/5, step ", 60s);
  harness::Instance victim;
  for (auto& [host, i] : run.instances()) {
    if (i.group == "data_group") victim = i;
  }
  REQUIRE(victim.pid > 0);
  // docs/lifecycle.md: "two processes claim to be it" unless the new one's incarnation is higher.
  Run same({HETERO_TRAIN}, twinEnv(victim.pid, victim.host, 0, tempPath("twin0.json")));
  CHECK(same.wait(30s) == 5);  // JOIN_FAILED
  INFO(same.output());
  CHECK(same.output().find("host '" + victim.host +
                           "' has already joined (incarnation 0); two "
                           "processes claim to be it") != std::string::npos);
  // The live process's outcome is the host's: the refused one writes no output/failure (the
  // fault hunt saw it overwrite the host's).
  std::string root;
  for (auto& e : environOf(victim.pid)) {
    if (e.rfind("TROUPE_SM_ROOT=", 0) == 0) root = e.substr(strlen("TROUPE_SM_ROOT="));
  }
  REQUIRE_FALSE(root.empty());
  CHECK_FALSE(std::filesystem::exists(root + "/output/failure"));
  CHECK(same.output().find("another process of this host is in the job; its output/failure is "
                           "the host's") != std::string::npos);
  Run higher({HETERO_TRAIN}, twinEnv(victim.pid, victim.host, 1, tempPath("twin1.json")));
  REQUIRE_OUTPUT(run, "replaced by incarnation 1 of the same host", 30s);
  // It ends with the job.
  CHECK(higher.wait(300s) == 0);
  int code = run.wait(120s);
  auto out = run.output();
  INFO(out + "\n--- the replacement ---\n" + higher.output());
  // The old process was fenced (7): the sim's word for the host it started.
  CHECK(code == 7);
  CHECK(run.exitLine(victim.host).find("exited with 7") != std::string::npos);
  CHECK(out.find(victim.host + " (data_group) rejoined (incarnation 1)") != std::string::npos);
  train_job::checkEverySampleOnce(report, 5, samples);
  CHECK(run.leftovers().empty());
}

TEST_CASE("a process that joins as its job ends OK exits 0 with the job (not 5)",
          "[train][membership]") {
  // The fault hunt's case: a data instance frozen near the end and started again was told "the
  // job is ending (OK)" and exited 5, so the host's earlier 7 stood and the job read as Failed.
  // Here the end is held open 10 s by an actor that never stops (probe's end-slowly), and a
  // process started again for a data host joins inside that window.
  Run run(harness::sim(train_job::kCluster, harness::probe("end-slowly")),
          {"TROUPE_STOP_TIMEOUT_MS=10000"});
  REQUIRE_OUTPUT(run, "ENDING", 60s);
  auto victim = harness::instanceIn(run, "data_group");
  REQUIRE(victim.pid > 0);
  auto argv = harness::probe("end-slowly");
  Run late(argv, twinEnv(victim.pid, victim.host, 1, tempPath("late-map.json")));
  CHECK(late.wait(30s) == 0);
  INFO(late.output());
  CHECK(late.output().find("the job ended as this node joined; it ends with the job's code, 0 "
                           "(OK)") != std::string::npos);
  CHECK(run.wait(60s) == 0);
  INFO(run.output());
  CHECK(run.output().find("troupe sim: all 3 instances exited 0") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE(
    "after its job has ended, a process started again ends 0 at once saying the job is "
    "over, and a first one says the head has ended or not started",
    "[train][membership]") {
  // Connection refused: the head's host answers and no head listens. A head is never started
  // again, so a restarted worker has no partition to wait out (it waited 11 s before), and it
  // knows the job is over: it ends 0 (before: 5, and the host's outcome its predecessor's, which
  // failed a job that had succeeded); a first process may have come up before its head or after
  // its job, and says both.
  Run run(harness::sim(train_job::kCluster, harness::probe("end-slowly")),
          {"TROUPE_STOP_TIMEOUT_MS=500"});
  REQUIRE_OUTPUT(run, "ENDING", 60s);
  auto victim = harness::instanceIn(run, "data_group");
  // The sim removes its folder (the secret, the cluster file) as it ends: copies, as an instance
  // of a real cluster keeps its own.
  troupe::testing::TempDir kept;
  auto keep = [&](std::vector<std::string> env) {
    for (auto& e : env) {
      auto eq = e.find('=');
      auto path = e.substr(eq + 1);
      if (path.rfind("/tmp/troupe-sim-", 0) != 0 || !std::filesystem::exists(path)) continue;
      // A file (the secret, 0600 as it must be) or a folder (the instance's SageMaker root).
      auto copy = kept / (e.substr(0, eq) + "-" + std::filesystem::path(path).filename().string());
      std::filesystem::copy(path, copy,
                            std::filesystem::copy_options::overwrite_existing |
                                std::filesystem::copy_options::recursive);
      if (std::filesystem::is_regular_file(copy)) {
        std::filesystem::permissions(copy, std::filesystem::perms::owner_read |
                                               std::filesystem::perms::owner_write);
      }
      e = e.substr(0, eq + 1) + copy;
    }
    return env;
  };
  auto restarted = keep(twinEnv(victim.pid, victim.host, 1, tempPath("gone-map1.json")));
  auto first = keep(twinEnv(victim.pid, victim.host, 0, tempPath("gone-map0.json")));
  first.push_back("TROUPE_JOIN_TIMEOUT_MS=3000");
  REQUIRE(run.wait(60s) == 0);
  auto started = std::chrono::steady_clock::now();
  Run again(harness::probe("end-slowly"), restarted);
  CHECK(again.wait(30s) == 0);
  auto took = std::chrono::steady_clock::now() - started;
  INFO(again.output());
  CHECK(again.output().find("the job is over: nothing has listened at the head ") !=
        std::string::npos);
  CHECK(again.output().find(" for 2000 ms (connection refused), and a head is never started "
                            "again; this host, started again (incarnation 1), ends 0") !=
        std::string::npos);
  CHECK(took < 15s);  // not the 60 s join deadline a partition gets
  Run late(harness::probe("end-slowly"), first);
  CHECK(late.wait(30s) == 5);
  INFO(late.output());
  CHECK(late.output().find("within 3000 ms: nothing listened there the whole time (connection "
                           "refused): the job's head has ended, or has not started") !=
        std::string::npos);
}
