// `troupe advise REPORT.json [--prices FILE] [--json] [--max-count N] [--types a,b,c]
// [--dnn-type TYPE --compute-step-ms MS]`: the sizing advisor (deploy/advise/advise.h) on a
// hetero_train report. docs/advisor.md.

#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

struct AdviseOptions {
  std::string report, prices;
  std::vector<std::string> types;
  unsigned maxCount = 4;
  bool json = false;
  // What-if: another dnn instance type, and a (GPU) trainer's compute-only step in ms.
  std::string dnnType;
  double computeStepMs = 0;
  double cpuScale = 0;  // what if a vCPU were this much of the run's CPU (0: the run's)
};

void addAdviseOptions(CLI::App& command, AdviseOptions& o);

/// Prints the table (or JSON); returns 0, or troupe::CONFIG_ERROR after a message naming the
/// file, the field or the value at fault.
int runAdvise(const AdviseOptions& o);
