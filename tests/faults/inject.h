// The faults themselves: each function returns the plan of one injection (fault_case.h), to be
// run by fault_run.cpp from the case's random moment on.

#pragma once

#include "fault_case.h"

namespace faults {

Plan signalOne(const harness::Instance& who, int sig);
// `sig` to one instance.
Plan signalTwice(const harness::Instance& who, Rng& rng, int minMs, int maxMs);
// SIGTERM, and a second one a random [minMs, maxMs] later (an impatient operator, a supervisor
// that escalates).
Plan signalAll(const Target& t, int sig);
// `sig` to every instance, in one go.
Plan signalSim(const Target& t, int sig);
Plan freeze(const harness::Instance& who, Rng& rng, int minMs, int maxMs);
// SIGTERM to `who` (a drain), then SIGSTOP 200-1000 ms later for `holdMs`, then SIGCONT.
Plan drainThenFreeze(const harness::Instance& who, Rng& rng, int holdMs);
// SIGSTOP, then SIGCONT after a random [minMs, maxMs].
Plan partition(const Target& t, const harness::Instance& who, Rng& rng, int minMs, int maxMs);
// Takes the instance's eth0 down in its --netns namespace (no TCP close, no RST: packets just
// stop), and up again after a random [minMs, maxMs]; maxMs < 0: it stays down.
Plan slowLink(const Target& t, const harness::Instance& who, Rng& rng, int minMs, int maxMs);
// Limits the instance's outgoing link to 8 Mbit/s (tc tbf on eth0 in its --netns namespace) for a
// random [minMs, maxMs], then lifts the limit; each step is checked (tc's exit code and the qdisc
// it then shows).
Plan garbage(const harness::Instance& who, Rng& rng);
// Strangers on the instance's port: random bytes, a connection that never sends, and Cap'n Proto
// frame headers announcing a huge message. The silent connections stay open until the plan goes.

std::string namespaceOf(int simPid, const std::string& host);
// troupe-<simPid>-<n> for algo-<n> (deploy/local/netns.h).
std::string netnsUnavailable();
// Why `troupe sim --netns` cannot run here, or "".
void removeNetnsLeftovers(int simPid, size_t instances);
// What a sim killed before its own clean-up left: namespaces, /etc/netns entries, its bridge.
int runCommand(const std::vector<std::string>& argv);
// Runs argv with its output discarded; its exit code, or -1.

}  // namespace faults
