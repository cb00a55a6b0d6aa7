#include "control/throttle.h"

#include <fstream>
#include <sstream>

#include "troupe/node_size.h"

namespace troupe {

namespace {

uint64_t throttledUs(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return parseThrottledUs(text.str()).value_or(0);
}

}  // namespace

ThrottleWatch::ThrottleWatch() {
  try {
    files_ = cgroupCpuStatFiles();
  } catch (const std::exception&) {
    // No cgroup to read (a malformed mountinfo): nothing to say.
  }
  marks_.resize(files_.size());
  mark();
}

ThrottleWatch::Held ThrottleWatch::since() const {
  Held held;
  for (size_t i = 0; i < files_.size(); ++i) {
    uint64_t now = throttledUs(files_[i]);
    int64_t ms = now > marks_[i] ? int64_t((now - marks_[i]) / 1000) : 0;
    if (ms > held.ms) held = {ms, files_[i]};
  }
  return held;
}

void ThrottleWatch::mark() {
  for (size_t i = 0; i < files_.size(); ++i) marks_[i] = throttledUs(files_[i]);
}

std::string throttleNote(const ThrottleWatch::Held& held) {
  if (held.ms <= 0) return "";
  return "; its cgroup's CPU quota throttled it " + std::to_string(held.ms) +
         " ms since the heartbeat before (" + held.file +
         "): time spent past a quota is repaid with every thread of the cgroup stopped; give it "
         "more CPU, or a --node-timeout-ms above such stalls";
}

}  // namespace troupe
