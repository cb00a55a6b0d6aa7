// `troupe status`: a running job's nodes, groups, actors and per-node CPU use, asked of its head
// (troupe/status.h has what is measured where, and how the client authenticates).
//
//   troupe status                                   the newest running `troupe sim` job here
//   troupe status --head 10.0.0.5:7077 --token-file secret [--insecure] [--json]

#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace sim {

struct StatusOptions {
  std::string head;          // "host:port"; empty: the newest running troupe sim job (job_file.h)
  std::string tokenFile;     // --token-file / TROUPE_TOKEN_FILE
  std::string refusedToken;  // --token: refused, with the reason
  bool insecure = false;     // --insecure / TROUPE_INSECURE
  bool json = false;         // --json: one JSON object
  unsigned timeoutMs = 5000;
};

CLI::App* addStatusCommand(CLI::App& cli, StatusOptions& options);
// The `status` subcommand and its options, writing into `options`.

int runStatus(const StatusOptions& options);
// Fetches and prints the status; returns the exit code: 0, CONFIG_ERROR (bad options, no or bad
// secret), AUTH_FAILED (the job holds another secret), JOIN_FAILED (no job answered).

}  // namespace sim
