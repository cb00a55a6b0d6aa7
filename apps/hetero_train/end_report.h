// hetero_train's report of a job that ended before its own (a stop, a failed actor, a lost node):
// what was trained, as far as the head knows it at the end (the trainer's last progress, the
// newest checkpoint), written where the finished job's report would have been.

#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "troupe/train/checkpoint.h"
#include "troupe/driver.h"

namespace hetero_train {

// The trainer's progress() as the head last read it.
struct Progress {
  bool read = false;
  uint32_t epoch = 0;  // the epoch in progress, from 0
  uint64_t steps = 0, plannedSteps = 0, samples = 0;
  double seconds = 0;
  std::chrono::steady_clock::time_point at;
};

// What the job's end needs when the job did not reach its own report; the driver fills it as it
// runs and the end callback (Driver::onJobEnd) owns it after the driver is gone.
struct EndState {
  std::string reportPath;     // --report; empty: no file, the summary line only
  std::string checkpointDir;  // --checkpoint-dir; empty: no checkpoints to read
  troupe::train::JobIdentity identity;
  unsigned epochs = 0;
  nlohmann::json placements = nlohmann::json::array();
  Progress progress;
  bool reported = false;  // the job's own report is written: nothing to add at its end
};

// The report of an unfinished job: `exit_status`, `exit_code_name`, `reason`, `finished` (false),
// `progress`, `checkpoint` and its finished `epochs`, `placements`, `instances`, `membership`.
nlohmann::json endReport(const EndState& state, const troupe::JobEnd& end,
                         nlohmann::json instances, const std::vector<std::string>& membership);

// Prints what the job trained before its end and writes endReport() to state.reportPath. Never
// throws: the job has ended already, and what cannot be written is said in the log.
void reportEnd(const EndState& state, const troupe::JobEnd& end, nlohmann::json instances,
               const std::vector<std::string>& membership);

// Writes `text` to `path` whole or not at all, making its folder (SageMaker's output/data/ need
// not exist). Throws kj::Exception naming the path on failure.
void writeReport(const std::string& path, const std::string& text);

// "0x" and 16 hex digits: a 64-bit value JSON readers keep exactly (a number above 2^53 loses
// its low bits in many of them).
std::string hex(uint64_t v);

}  // namespace hetero_train
