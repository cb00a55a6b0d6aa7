// probe_app's parts (probe_app.cpp has the app and its actor): the scenarios, each one part of the
// lifecycle across real processes, printing lines the tests look for.
//   probe_lifecycle.cpp  links, monitors, restarts, references that follow them, the cascade
//   probe_runtime.cpp    placement, mailboxes, deadlines, capacity waits, gangs, stalls, errors

#pragma once

#include <string>

#include "probe.capnp.h"
#include "troupe/troupe.h"

namespace probe_app {

void say(const std::string& line);
// One line on stdout, flushed: what the tests read.

troupe::SpawnOptions labelled(const std::string& label, bool hang = false);
kj::Promise<void> crash(probe::Probe::Client p, std::string why);
// Asks `p` to fail; the call itself fails DISCONNECTED (docs/lifecycle.md).
kj::Promise<void> pingAll(kj::ArrayPtr<troupe::Ref<probe::Probe>> probes);

using Job = troupe::Driver;
using Scenario = kj::Promise<void> (*)(Job&);

Scenario lifecycleScenario(const std::string& name);  // nullptr: not one of probe_lifecycle.cpp's
Scenario runtimeScenario(const std::string& name);    // nullptr: not one of probe_runtime.cpp's

}  // namespace probe_app
