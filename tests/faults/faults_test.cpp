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
  run << "case " << name << " (" << c->what << "), seed " << seed << ", moment " << obs.momentMs
      << " ms after the first progress line: " << obs.plan << "; codes " << faults::codesText(obs);
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

TEST_CASE("the fault table - unique names and the quick subset registered here", "[faults]") {
  std::set<std::string> names, quick;
  for (auto& c : faults::allCases()) {
    CHECK(names.insert(c.name).second);
    CHECK(c.name.find_first_of(" ;,") == std::string::npos);
    if (c.quick) quick.insert(c.name);
  }
  // The TEST_CASEs above: a row marked quick runs in `make test` only when it has one.
  CHECK(quick == std::set<std::string>{"data-kill9", "head-kill9", "head-sigterm", "data-stop-long",
                                       "data-partition-long", "data-slow-link",
                                       "head-garbage"});
}
