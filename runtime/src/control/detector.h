// A phi-accrual failure detector (Hayashibara et al., 2004; as Akka and Cassandra use it): how
// suspicious a node's silence is, given the gaps between the heartbeats it sent so far. A node on a
// steady link is suspected soon after its usual gap has passed; one whose heartbeats come with
// jitter (a slow link, a busy host) is given the slack its own history shows, up to a hard bound
// for a node that sends nothing. Plain data, no clock of its own: times are milliseconds on any
// monotonic clock. docs/lifecycle.md, "How a silent node is judged".

#pragma once

#include <cstddef>
#include <deque>
#include <string>

namespace troupe {

class PhiDetector {
 public:
  struct Settings {
    double heartbeatMs = 500;         // the expected gap: the history starts from it
    double acceptablePauseMs = 2500;  // added to the mean gap: silence any link may show
    double minStdDevMs = 100;         // the spread assumed at least, however regular the history
    double threshold = 8;             // phi past which the node is lost (1 in 10^8 of being wrong)
    double maxSilenceMs = 6000;       // the hard bound: silence past it is lost whatever phi says
    size_t window = 100;              // gaps remembered
  };

  PhiDetector(Settings settings, double nowMs);

  void heartbeat(double nowMs);
  // A heartbeat arrived now: its gap from the previous one joins the history.
  void credit(double ms);
  // The judge itself stalled for `ms` (frozen, starved): that silence was not the node's.

  double silenceMs(double nowMs) const { return nowMs - last_; }
  double phi(double nowMs) const;
  // -log10 of the probability that a heartbeat still comes after this much silence, under a
  // normal distribution of gaps (mean + acceptable pause, spread from the history). Grows without
  // bound with the silence; 0 right after a heartbeat.
  bool lost(double nowMs) const {
    double silence = silenceMs(nowMs);
    return silence >= settings_.maxSilenceMs || phi(nowMs) >= settings_.threshold;
  }
  std::string verdict(double nowMs) const;
  // "no heartbeat for 3561 ms (phi 8.1 >= 8; its gaps: mean 500 ms, deviation 12 ms)" or
  // "no heartbeat for 6000 ms (the hard bound, --node-timeout-max-ms)".

  double meanGapMs() const { return sum_ / gaps_.size(); }
  double stdDevMs() const;
  // Of the gaps in the history (at least minStdDevMs).
  const Settings& settings() const { return settings_; }

 private:
  Settings settings_;
  double last_;
  std::deque<double> gaps_;
  double sum_ = 0;
  double sumSquares_ = 0;
};

}  // namespace troupe
