#include "control/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace troupe {

PhiDetector::PhiDetector(Settings settings, double nowMs) : settings_(settings), last_(nowMs) {
  // The history starts as two gaps of the expected length spread by a quarter of it (Akka's
  // first estimate), so the first judgements are neither hair-trigger nor blind.
  double gap = settings_.heartbeatMs, spread = settings_.heartbeatMs / 4;
  for (double g : {gap - spread, gap + spread}) {
    gaps_.push_back(g);
    sum_ += g;
    sumSquares_ += g * g;
  }
}

void PhiDetector::heartbeat(double nowMs) {
  double gap = std::max(0.0, nowMs - last_);
  last_ = std::max(last_, nowMs);
  gaps_.push_back(gap);
  sum_ += gap;
  sumSquares_ += gap * gap;
  while (gaps_.size() > settings_.window) {
    double old = gaps_.front();
    gaps_.pop_front();
    sum_ -= old;
    sumSquares_ -= old * old;
  }
}

void PhiDetector::credit(double ms) { last_ += std::max(0.0, ms); }

double PhiDetector::stdDevMs() const {
  double n = gaps_.size(), mean = sum_ / n;
  double variance = std::max(0.0, sumSquares_ / n - mean * mean);
  return std::max(settings_.minStdDevMs, std::sqrt(variance));
}

double PhiDetector::phi(double nowMs) const {
  double mean = meanGapMs() + settings_.acceptablePauseMs;
  double y = (silenceMs(nowMs) - mean) / stdDevMs();
  // P(a gap longer than this) under N(mean, sd); erfc keeps precision far into the tail.
  double later = 0.5 * std::erfc(y / std::sqrt(2.0));
  if (later <= 0) return INFINITY;
  return std::max(0.0, -std::log10(later));
}

std::string PhiDetector::verdict(double nowMs) const {
  char text[200];
  double silence = silenceMs(nowMs);
  if (silence >= settings_.maxSilenceMs) {
    std::snprintf(text, sizeof text, "no heartbeat for %.0f ms (the hard bound, --node-timeout-max-ms)",
                  silence);
  } else {
    std::snprintf(text, sizeof text,
                  "no heartbeat for %.0f ms (phi %.1f >= %.0f; its gaps: mean %.0f ms, deviation "
                  "%.0f ms)",
                  silence, phi(nowMs), settings_.threshold, meanGapMs(), stdDevMs());
  }
  return text;
}

}  // namespace troupe
