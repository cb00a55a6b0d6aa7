// bench_rpc's troupe modes, each run in processes of its own: a two-node cluster under `troupe
// sim` whose nodes are bench_rpc itself (started with kNodeFlag); the driver, on the head, calls
// an echo actor on the other node, measures as every mode does (measure.h) and prints its figures
// on one line, which the bench parses.

#pragma once

#include "measure.h"

namespace troupe::bench {

constexpr char kNodeFlag[] = "--troupe-node";
// First argument of a bench_rpc process that is a troupe node; the next one is the options.

int runTroupeNode(int argc, char** argv);
// main() of a bench_rpc process started by `troupe sim` with kNodeFlag (never returns).

Figures runTroupe(const Options& options);
// (c) A troupe actor call (TLS, as every troupe connection): the cluster's figures.

Figures runTroupeRestartable(const Options& options);
// (c2) The same with a restart policy on the echo actor, whose reference is then a local
// forwarding capability that can follow it to a new incarnation.

Figures runTroupeInsecure(const Options& options);
// (c0) (c) with `--insecure` on both nodes: plaintext, what TLS costs a troupe call.

}  // namespace troupe::bench
