// The quick subset of the fault matrix (docs/faults.md), one random seed each: hetero_train under
// `troupe sim`, hit at a random moment after training started. FAULT_SEED=N reproduces a run;
// `fault_soak` runs every case with many seeds.
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <set>
#include <sstream>

#include "fault_run.h"
#include "verdict.h"

#include <troupe/exit_codes.h>

namespace {

uint64_t seedFromEnvironment() {
  if (const char* s = getenv("FAULT_SEED")) return std::stoull(s);
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// The sim's output without the progress lines (five a second), the last `lines` of it.
std::string outputTail(const std::string& output, size_t lines = 120) {
  std::vector<std::string> kept;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find("progress: epoch") == std::string::npos) kept.push_back(line);
  }
  std::string out;
  for (size_t i = kept.size() > lines ? kept.size() - lines : 0; i < kept.size(); ++i) {
    out += kept[i] + "\n";
  }
  return out;
}

void runQuick(const char* name) {
  const auto* c = faults::findCase(name);
  REQUIRE(c != nullptr);
  auto seed = seedFromEnvironment();
  // Printed before the run, so a run that times out under ctest still names its seed.
  printf("fault case %s: seed %llu (FAULT_SEED=%llu reproduces it)\n", name,
         (unsigned long long)seed, (unsigned long long)seed);
  fflush(stdout);
  auto obs = faults::runCase(*c, seed, faults::Options::fromBuild());
  if (!obs.skipped.empty()) {
    // ctest reports the case as skipped (SKIP_REGULAR_EXPRESSION in CMakeLists.txt).
    WARN("skipping: fault case " << name << ": " << obs.skipped);
    return;
  }
  auto checks = faults::judge(*c, obs);
  std::ostringstream run;
  run << "case " << name << " (" << c->what << "), seed " << seed << ", " << obs.moment << ", "
      << obs.momentMs << " ms after the first progress line: " << obs.plan << "; codes "
      << faults::codesText(obs);
  bool ok = true;
  for (auto& check : checks) {
    // The promise first: it is what a failure means.
    INFO(check.promise);
    INFO(run.str());
    CHECK(check.ok);
    ok = ok && check.ok;
  }
  if (!ok) WARN(run.str() << "\noutput without progress lines:\n" << outputTail(obs.output));
  printf("fault case %s: %s in %.1f s (%s)\n", name,
         faults::outcomeName(faults::outcomeOf(obs, checks)), obs.seconds,
         faults::codesText(obs).c_str());
}

}  // namespace

TEST_CASE("data-kill9 - kill -9 a data instance mid-epoch - the job completes exactly-once",
          "[faults]") {
  runQuick("data-kill9");
}

TEST_CASE("head-kill9 - kill -9 the head - workers exit HEAD_LOST within the head timeout",
          "[faults]") {
  runQuick("head-kill9");
}

TEST_CASE("head-sigterm - SIGTERM to the head mid-step - every node exits INTERRUPTED",
          "[faults]") {
  runQuick("head-sigterm");
}

TEST_CASE("data-stop-long - a data instance frozen past the node timeout is fenced", "[faults]") {
  runQuick("data-stop-long");
}

TEST_CASE("data-partition-long - a data instance cut off for good - the job goes on",
          "[faults][netns]") {
  runQuick("data-partition-long");
}

TEST_CASE("data-slow-link - a data instance's link at 8 Mbit/s - no node is fenced",
          "[faults][netns]") {
  runQuick("data-slow-link");
}

TEST_CASE("head-garbage - garbage on the head's port - the job completes exactly-once",
          "[faults]") {
  runQuick("head-garbage");
}

TEST_CASE("all-sigterm-early - SIGTERM to every instance in its first 500 ms - all exit 6",
          "[faults]") {
  runQuick("all-sigterm-early");
}

TEST_CASE("data-kill9-rejoin - kill -9 a data instance started again - it rejoins, all exit 0",
          "[faults][membership]") {
  runQuick("data-kill9-rejoin");
}

TEST_CASE("data-sigterm - SIGTERM to one data instance - a drain, every instance exits 0",
          "[faults][membership]") {
  runQuick("data-sigterm");
}

TEST_CASE("data-partition-heals - a data link down for 6 s - it rejoins, every instance exits 0",
          "[faults][netns][membership]") {
  runQuick("data-partition-heals");
}

TEST_CASE("the fault table - unique names and the quick subset registered here", "[faults]") {
  std::set<std::string> names, quick;
  for (auto& c : faults::allCases()) {
    CHECK(names.insert(c.name).second);
    CHECK(c.name.find_first_of(" ;,") == std::string::npos);
    if (c.quick) quick.insert(c.name);
  }
  // The TEST_CASEs above: a row marked quick runs in `make test` only when it has one.
  CHECK(quick == std::set<std::string>{"data-kill9", "head-kill9", "head-sigterm", "data-stop-long",
                                       "data-partition-long", "data-slow-link", "head-garbage",
                                       "all-sigterm-early", "data-kill9-rejoin", "data-sigterm",
                                       "data-partition-heals"});
}

namespace {

// A data-kill9 run that ended as promised, as the harness would have observed it; each check of
// the verdict below breaks one thing in it.
faults::Observation goodDataKill9() {
  faults::Observation obs;
  obs.caseName = "data-kill9";
  obs.plan = "SIGKILL to algo-3 (data_group)";
  harness::Instance head{"algo-1", "dnn_group", "127.0.0.1:1", 101};
  harness::Instance worker{"algo-2", "data_group", "127.0.0.1:2", 102};
  harness::Instance victim{"algo-3", "data_group", "127.0.0.1:3", 103};
  obs.instances = {{head, "head", 0, 1, "exit-status", 10.0, ""},
                   {worker, "worker", 0, 1, "exit-status", 10.0, ""},
                   {victim, "victim", 137, 1, "exit-status", 0.1, ""}};
  obs.simCode = 137;  // a host killed for good: the cloud calls the job failed
  obs.simGoneS = 10.5;
  return obs;
}

std::vector<std::string> broken(const faults::Observation& obs) {
  std::vector<std::string> out;
  for (auto& c : faults::judge(*faults::findCase(obs.caseName), obs)) {
    if (!c.ok) out.push_back(c.promise);
  }
  return out;
}

bool anyMentions(const std::vector<std::string>& promises, const std::string& text) {
  for (auto& p : promises) {
    if (p.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the verdict - each oracle check fails on the run it exists to catch", "[faults]") {
  auto good = goodDataKill9();
  std::string digest = faults::expectedDigestText(faults::kSamples);
  std::vector<faults::EpochCount> epochs(faults::kEpochs, {faults::kSamples, 0, 0, digest});
  good.report = epochs;
  INFO("the good run breaks: " << (broken(good).empty() ? "nothing" : broken(good).front()));
  REQUIRE(broken(good).empty());

  SECTION("a trainer whose counters agree but whose digest does not (one sample swapped)") {
    auto obs = good;
    (*obs.report)[2].digest = faults::expectedDigestText(faults::kSamples - 1);
    CHECK(anyMentions(broken(obs), "epoch 3's digest"));
  }
  SECTION("an instance gone with no word from the OS of how it ended") {
    auto obs = good;
    obs.instances[1].code = -1;
    obs.instances[1].codeFrom = "";
    CHECK(anyMentions(broken(obs), "its status is unknown"));
  }
  SECTION("a failure file that names another code, or no cause") {
    auto obs = good;
    obs.instances[1].code = troupe::FENCED;
    obs.instances[1].failure = "something went wrong\nexit code 3 (HEAD_LOST) on algo-2\n";
    auto b = broken(obs);
    CHECK(anyMentions(b, "must say 'exit code 7 (FENCED)'"));
    CHECK(anyMentions(b, "must name its cause"));
  }
  SECTION("a sim that exits 0 while a host ended killed (SageMaker: a Failed job)") {
    auto obs = good;
    obs.simCode = 0;
    CHECK(anyMentions(broken(obs), "as the cloud judges it, algo-3's final 137"));
  }
  SECTION("a rejoin case whose victim was never started again, or got no work") {
    auto obs = good;
    obs.caseName = "data-kill9-rejoin";
    obs.instances[2].code = 0;
    obs.simCode = 0;
    auto b = broken(obs);
    CHECK(anyMentions(b, "must be started again and rejoin; it ran 1 process(es)"));
    CHECK(anyMentions(b, "the output must say 'augmenters placed on algo-3 as it joined'"));
    obs.instances[2].processes = 2;
    obs.output = "[algo-1] 4 augmenters placed on algo-3 as it joined the job\n";
    // The head placed augmenters, but no batch of theirs reached the trainer.
    CHECK(anyMentions(broken(obs), "the trainer gets batches from the process that rejoined"));
    obs.output += "[algo-1] first batch from 'augmenter-9' on algo-3, added as its node joined\n";
    CHECK(broken(obs).empty());
  }
  // Each remaining outcome, from the run it names: the promise broken and the run's outcome.
  auto outcome = [](const faults::Observation& obs) {
    return faults::outcomeName(
        faults::outcomeOf(obs, faults::judge(*faults::findCase(obs.caseName), obs)));
  };
  CHECK(std::string(outcome(good)) == "pass");
  SECTION("a crash: a worker that segfaulted, or a sanitizer's report in the output") {
    auto obs = good;
    obs.instances[1].code = 139;
    CHECK(anyMentions(broken(obs), "no crash (docs/exit-codes.md: never 134 or 139)"));
    CHECK(std::string(outcome(obs)) == "crash");
    obs = good;
    obs.output = "[algo-2] ==4242==ERROR: AddressSanitizer: heap-use-after-free on address\n";
    CHECK(anyMentions(broken(obs), "no sanitizer report"));
    CHECK(std::string(outcome(obs)) == "crash");
  }
  SECTION("a hang: a worker gone after its bound, or a sim never gone") {
    auto obs = good;
    obs.instances[1].goneS = 500.0;
    CHECK(anyMentions(broken(obs), "must be gone within"));
    CHECK(std::string(outcome(obs)) == "hang");
    obs = good;
    obs.simGoneS.reset();
    CHECK(anyMentions(broken(obs), "troupe sim and everything it started must be gone"));
    CHECK(std::string(outcome(obs)) == "hang");
  }
  SECTION("a fault that came after training ended proves nothing: late") {
    auto obs = good;
    obs.late = true;
    obs.moment = "after 'job finished'";
    CHECK(anyMentions(broken(obs), "the fault must land while training runs"));
    CHECK(std::string(outcome(obs)) == "late");
  }
  SECTION("a job whose training never started proves nothing: no-start") {
    auto obs = good;
    obs.notStarted = "no progress line within 60 s";
    CHECK(anyMentions(broken(obs), "training must start"));
    CHECK(std::string(outcome(obs)) == "no-start");
  }
  SECTION("a case that cannot run here is a skip, never a pass") {
    auto obs = good;
    obs.skipped = "--netns needs root";
    CHECK(std::string(outcome(obs)) == "skipped");
  }
  SECTION("an injection one of whose steps did not happen") {
    auto obs = good;
    obs.notInjected = {"SIGKILL to algo-3 (pid 103): No such process"};
    CHECK(anyMentions(broken(obs), "every step of the injection must happen"));
  }
}
