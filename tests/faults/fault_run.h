// Running one case of the fault matrix: hetero_train under `troupe sim`, the fault at a random
// moment after training started, then watching every process until it is gone or its bound
// passes. What was seen is an Observation; verdict.h judges it against the case's promises.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fault_case.h"

namespace faults {

struct Options {
  std::string troupe;         // the `troupe` binary
  std::string app;            // hetero_train
  double maxStepShare = 0.5;  // the fault lands after step K, K drawn from 1..share x planned steps
  int maxExtraMs = 200;       // and 0..maxExtraMs after the progress line that showed step >= K
  bool quiet = false;         // no harness reasons on stderr: fault_soak prints one line a run
  static Options fromBuild();
  // The binaries this test was built with; FAULT_TROUPE and FAULT_HETERO_TRAIN override them.
};

struct InstanceEnd {
  harness::Instance instance;
  std::string role;             // "head", "victim" (the data instance hit) or "worker"
  int code = -1;                // the host's final code (docs/exit-codes.md), 128 + signal when
                                // killed; -1: never seen to exit
  int processes = 1;            // processes the host ran (troupe sim --node-restarts)
  std::string codeFrom;         // where `code` was read (the OS's word), or why it could not be
  std::optional<double> goneS;  // seconds from the moment to when it was seen gone
  std::string failure;          // its output/failure ("" when there is none)
};

struct EpochCount {
  uint64_t samples = 0, duplicates = 0, missing = 0;  // the trainer's own counters
  std::string digest;  // the trainer's digest of the ids it trained on (docs/hetero_train.md)
};

struct Observation {
  std::string caseName;
  uint64_t seed = 0;
  std::string skipped;     // why the case could not run here, or ""
  std::string notStarted;  // why training never started, or ""
  bool late = false;       // training had ended when the fault came: the run proves nothing
  int momentMs = 0;        // after the first progress line
  std::string moment;      // "after step 143 of 564 (seen at step 150, +87 ms)"
  std::string plan;        // the injection in words
  std::vector<std::string> notInjected;  // steps of it that did not happen
  std::vector<InstanceEnd> instances;
  int simCode = -1;
  std::optional<double> simGoneS;
  bool simTermedLiveHead = false;  // the sim SIGTERMed instances while the head still ran
  std::optional<std::vector<EpochCount>> report;
  std::string reportError;  // why there is no report, when the head exited 0
  std::string output;       // everything the sim printed
  double seconds = 0;       // the whole case

  const InstanceEnd* head() const;
};

Observation runCase(const Case& c, uint64_t seed, const Options& options);

constexpr uint64_t kSamples = 12000;  // --train-samples
// --epochs: 6, so that a moment up to 3 s after the first progress line lands in training: on the
// 2-core VM an epoch of 12,000 samples takes 0.6-2.7 s (the first one longest), and with 4 epochs
// 4 of 103 runs of a soak landed after the job had finished.
constexpr size_t kEpochs = 6;

}  // namespace faults
