// run()'s flags as a CLI11 parser's options (run_options.cpp): run.cpp parses the command line
// and TROUPE_* variables with them, and runFlags() lists them.

#pragma once

#include <CLI/CLI.hpp>
#include "troupe/run_options.h"

namespace troupe {

void addRunOptions(CLI::App& cli, RunOptions& o);
// troupe's own flags, each with its TROUPE_* variable, writing into `o`.

}  // namespace troupe
