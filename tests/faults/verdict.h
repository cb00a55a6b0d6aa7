// Judging an Observation against the promises of docs/exit-codes.md, docs/lifecycle.md and
// docs/hetero_train.md. Each promise is one Check whose text names it; a run's outcome is its
// worst broken promise.

#pragma once

#include <string>
#include <vector>

#include "fault_case.h"
#include "fault_run.h"

namespace faults {

enum class Outcome {  // ordered by severity: a run's outcome is its worst
  PASS,
  NO_FAILURE_FILE,  // an instance exited non-zero (not by SIGKILL) without output/failure
  WRONG_EXIT,       // an exit code other than the documented one
  SAMPLES_LOST,     // the job completed, but an epoch lost or repeated samples
  NO_START,         // training never started: the case proves nothing
  LATE,             // training had ended before the fault came: the codes prove nothing
  NOT_INJECTED,     // a step of the injection did not happen: the codes prove nothing
  HANG,             // a process outlived its bound
  CRASH,            // 134 (abort), 139 (segfault) or another fatal signal anywhere
  SKIPPED           // the case cannot run here (--netns without root)
};

const char* outcomeName(Outcome o);  // "wrong-exit"
const std::vector<Outcome>& allOutcomes();

struct Check {
  Outcome failsAs;
  std::string promise;  // "exit code (docs/exit-codes.md): ..."
  bool ok;
};

std::vector<Check> judge(const Case& c, const Observation& obs);
Outcome outcomeOf(const Observation& obs, const std::vector<Check>& checks);

std::string expectedDigestText(uint64_t samples);
// The digest docs/hetero_train.md defines for an epoch that trained on every id below `samples`
// exactly once ("0x..."), computed from the ids alone, with no runtime code: the oracle is not
// the system under test.

std::string codesText(const Observation& obs);
// "head algo-3=0 victim algo-1=137 worker algo-2=0 sim=0"

}  // namespace faults
