// What pytorch_test's files share: the Python environment of the build's package, the reason
// PyTorch cannot be used (a skip's one line), and the checks of what a script trained on.

#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "train_job.h"

namespace pytorch_test {

namespace fs = std::filesystem;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;

inline std::vector<std::string> pythonEnv() {
  return {std::string("PYTHONPATH=") + PYTHON_PACKAGE_DIR};
}

// Why the Python tests cannot run here ("" when they can): PyTorch missing, and nothing else. A
// troupe package that does not import fails the tests that use it (and the native module's own
// test, which needs no PyTorch, always runs).
inline std::string whyNoTorch() {
  std::string command = std::string(PYTHON3) + " -c 'import torch' > /dev/null 2>&1";
  if (std::system(command.c_str()) == 0) return "";
  return std::string("PyTorch cannot be imported by ") + PYTHON3 +
         ": install python3-torch (scripts/install-deps.sh does)";
}

#define SKIP_WITHOUT_TORCH()                     \
  if (auto why = whyNoTorch(); !why.empty()) {   \
    WARN("skipping: " << why);                   \
    return;                                      \
  }

// Where PyTorch imports but torchvision does not: the cases that use its transforms skip.
#define SKIP_WITHOUT_TORCHVISION()                                                             \
  if (std::system((std::string(PYTHON3) + " -c 'import torchvision' > /dev/null 2>&1").c_str()) \
      != 0) {                                                                                  \
    WARN("skipping: torchvision cannot be imported by " << PYTHON3                            \
                                                        << ": install python3-torchvision");   \
    return;                                                                                    \
  }

// The head's output/failure of a run started with --keep (its roots are removed).
inline std::string headFailure(Run& run) {
  auto roots = harness::rootsOf(run);
  REQUIRE(!roots.empty());
  auto failure = harness::readFile(roots + "/" + harness::headOf(roots) + "/output/failure");
  fs::remove_all(roots);
  return failure;
}

inline std::vector<std::string> feedCheck(std::vector<std::string> extra) {
  std::vector<std::string> argv = {PYTHON3, FEED_CHECK};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The ids file feed_check.py wrote ("<epoch> <id> ..." per trained batch, of every run): every
// one of `samples` ids trained exactly once in each of `epochs` epochs.
inline void checkIdsOnce(const std::string& path, unsigned epochs, unsigned samples) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::map<unsigned, std::vector<unsigned>> seen;
  std::string line;
  size_t batches = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    unsigned epoch, id;
    REQUIRE(bool(words >> epoch));
    auto& counts = seen[epoch];
    counts.resize(samples);
    while (words >> id) {
      REQUIRE(id < samples);
      ++counts[id];
    }
    ++batches;
  }
  INFO(batches << " batches in " << path);
  REQUIRE(seen.size() == epochs);
  for (auto& [epoch, counts] : seen) {
    size_t missing = 0, duplicated = 0;
    for (auto c : counts) {
      missing += c == 0;
      duplicated += c > 1;
    }
    INFO("epoch " << epoch + 1 << " as the script counted it");
    CHECK(missing == 0);
    CHECK(duplicated == 0);
  }
}

// The trainer's count (stream.report()): every epoch had every sample once, and its digest (a
// number there) is that of every id once, computed here.
inline nlohmann::json checkReportOnce(const nlohmann::json& report, unsigned epochs,
                                      unsigned samples) {
  INFO(report.dump());
  REQUIRE(report["epochs"].size() == epochs);
  const uint64_t want = std::stoull(test_digest::everyIdOnce(samples), nullptr, 16);
  for (auto& e : report["epochs"]) {
    CHECK(e["samples"] == samples);
    CHECK(e["duplicates"] == 0);
    CHECK(e["missing"] == 0);
    CHECK(e["digest"] == want);
  }
  return report;
}

inline nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace pytorch_test
