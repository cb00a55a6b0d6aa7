// File: troupe/run.h
//
// The entry point of every troupe binary:
//
//   int main(int argc, char* argv[]) {
//     troupe::Registry types;
//     types.add<Greeter>();  // as "hello.Greeter", its interface's name (troupe/type_name.h)
//     return troupe::run(argc, argv, types, [](troupe::Driver& job) { ... });
//   }
//
// run() reads the cluster description, decides this process's role, forms the cluster (the head
// waits for every expected host; workers join with retry), then either runs the driver (on the
// head) or serves as a worker until the head tells it to exit. It ends the process with the job's
// exit code (troupe/exit_codes.h) and never returns; its int type only lets main() say
// `return troupe::run(...)`.

#pragma once

#include "troupe/driver.h"
#include "troupe/registry.h"
#include "troupe/run_options.h"

namespace troupe {

[[noreturn]] int run(int argc, char* argv[], Registry& registry, DriverFunction driver,
                     RunOptions defaults = {});

namespace detail {
// Defined in hold_stops_entry.cpp, whose .preinit_array entry holds SIGTERM and SIGINT from the
// program's first instruction; run() refers to it, so every program that calls run() links it. A
// shared object cannot have that section: a Python module defines this itself (the archive member
// is then not linked) and holds the signals when it is imported (holdStopSignals()).
extern const bool kStopsHeldFromStart;
}  // namespace detail

}  // namespace troupe
