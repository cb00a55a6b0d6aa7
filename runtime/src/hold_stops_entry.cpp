// A program that calls troupe::run() holds SIGTERM and SIGINT from before its static
// initialisation until its node installs its handlers (troupe/loop.h): its first half second
// (loading the cluster, TLS, joining) is no longer a window where a stop kills it without a
// failure file, or where, as PID 1 of a container, the kernel drops it. This file is linked only
// into programs that call run(), through kStopsHeldFromStart (troupe/run.h); the `troupe` tool
// gives the signals back with releaseStopSignals(). In .preinit_array: the dynamic linker calls it
// before any library's initialisation (OpenCV's, BLAS's: tens of milliseconds), right after
// loading and relocating.

#include "troupe/loop.h"
#include "troupe/run.h"

namespace troupe {

namespace detail {
const bool kStopsHeldFromStart = true;
}  // namespace detail

namespace {
void holdStopsFromTheStart(int, char**, char**) {
  holdStopSignals();
}
[[gnu::used, gnu::section(".preinit_array")]] void (*const holdStopsEntry)(int, char**, char**) =
    &holdStopsFromTheStart;
}  // namespace

}  // namespace troupe
