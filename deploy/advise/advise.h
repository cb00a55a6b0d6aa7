// The sizing advisor: from one hetero_train run's measured rates (its --report), predict for each
// candidate data-group instance type and count the step time, the trainer's data-wait share and
// the cost per 1,000 steps, and mark the cheapest and the fastest. Pure functions: `troupe
// advise`, hetero_train (at the end of a run) and bench_pipeline all call these. The model and
// its assumptions are docs/advisor.md; `assumptions()` says them in the output too.

#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "prices.h"

namespace hetero_train::advise {

/// A report the advisor cannot use: names the field (or file) and what writes it.
struct AdviseError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// What one run measured, as the model needs it.
struct Measured {
  double augmentImagesPerVcpuSecond = 0;  // images per CPU-second of an augmenter's work
  double computeStepMs = 0;               // the trainer's time in training steps, per step
  double otherMsPerStep = 0;  // epoch time in neither steps nor data waits (evaluation,
                              // checkpoints), per step: on the trainer, not overlapped
  double trainerCpuMsPerStep = 0;  // the trainer process's CPU per step, all threads, without
                                   // augmenters that ran in it
  double fillMsPerEpoch = 0;       // waiting for each epoch's first batch
  double stepsPerEpoch = 0;
  double loadMsPerAugmenter = 0;   // CPU loading an augmenter's shards (once, in the first fill)
  unsigned epochs = 1;
  double streamBytesPerSecond = 0;  // batch bytes/s the trainer received in the run
  double bytesPerBatch = 0;
  unsigned batchSize = 0;
  bool trainerOnCpu = true;        // the trainer's steps use a CPU of the dnn instance
  unsigned augmentersPerNode = 0;  // 0: one per vCPU
  std::string dnnType;
  unsigned dnnCount = 1, dnnVcpus = 1;
  std::string dataType;  // empty when the run had no data group
  unsigned dataCount = 0;
  double dataVcpus = 0;  // each data instance's (bench_pipeline: a share of one CPU)
  double measuredStepMs = 0, measuredWaitShare = 0;
  bool spot = false;
  // CPUs of the run's machine per vCPU: 1 on real instances; troupe sim's CPU budget otherwise
  // (e.g. 0.125: 2 CPUs for 16 vCPUs). Predictions are for instances with this much CPU per vCPU.
  double cpuScale = 1;
  std::string whatIf;  // non-empty: the inputs were changed from the run's (said in the output)
  std::string cluster;  // the run's, as measured ("1 x ml.p3.2xlarge (8 vCPUs) + ...")
};

/// One data group to predict: `count` instances of `type`, each with `vcpus` vCPUs.
struct Candidate {
  std::string type;
  unsigned count = 0;
  double vcpus = 0;
};

struct Row {
  Candidate candidate;
  double stepMs = 0;         // predicted mean step, evaluation included
  double dataMs = 0;         // predicted time to augment one batch with the group
  double trainerMs = 0;      // the trainer's bound per step: its steps, or its instance's CPUs
  double streamBytesPerSecond = 0;  // the batch bytes/s the prediction needs
  double waitShare = 0;      // predicted share of the step the trainer waits for data
  double pricePerHour = 0;   // the whole cluster's
  bool priced = true;        // every instance had a price
  double costPer1000 = 0;    // USD per 1,000 steps
  bool beyondStream = false; // needs more batch bytes/s than the run measured
  bool cheapest = false, fastest = false, measured = false;
};

struct Advice {
  Measured measured;
  std::vector<Row> rows;
};

/// Reads the rates from a hetero_train --report object. Throws AdviseError naming the first
/// missing or invalid field and the hetero_train version that writes it.
Measured fromReport(const nlohmann::json& report);

/// What if the trainer ran on `type` (one instance; its vCPUs from the instance table). Throws
/// AdviseError for a type not in the table.
void setDnnType(Measured& m, const std::string& type);

/// Reads and parses a report file; throws AdviseError naming the file when it cannot.
Measured loadReport(const std::string& path);

/// The model for one candidate (count 0: augmentation on the dnn instance, as with no data group).
Row predict(const Measured& m, const Candidate& c, const Prices& prices);

/// Candidates: each type (default: the c5 family of the instance table) with 0..maxCount
/// instances. Throws AdviseError for a type not in the table.
std::vector<Candidate> candidates(const std::vector<std::string>& types, unsigned maxCount);

/// Predicts every candidate and marks the cheapest (priced rows only) and the fastest; ties go to
/// fewer instances. A candidate equal to the measured run's data group is marked `measured`.
Advice recommend(const Measured& m, const std::vector<Candidate>& candidates, const Prices& prices);

/// The assumptions the model makes, one sentence each.
std::vector<std::string> assumptions(const Measured& m);

/// The table (text) and the same as JSON.
std::string table(const Advice& a);
nlohmann::json toJson(const Advice& a);

}  // namespace hetero_train::advise
