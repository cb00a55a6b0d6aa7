// Lines `troupe sim` prints that tools read back (the fault matrix's oracle): one spelling, here,
// so that a changed message cannot leave a check that never matches.
#pragma once

namespace sim {

inline constexpr char kLingerSigterm[] = "after the head exited: SIGTERM";
// The end of "troupe sim: instances still running N ms after the head exited: SIGTERM": the sim
// ends instances that outlive the head by --linger-ms.

}  // namespace sim
