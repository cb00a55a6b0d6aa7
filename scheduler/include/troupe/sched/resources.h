// File: troupe/sched/resources.h
//
// Amounts of cpu, gpu, memory and custom resources: what a node has, what it has given out, and
// what one actor asks for. Pure value type; no I/O.

#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace troupe::sched {

/// Identifies a node for the life of a cluster. The runtime assigns it when the node joins.
using NodeId = uint32_t;

/// A bundle of resources.
///
/// cpu, gpu and custom amounts are fixed-point thousandths ("milli" units, like Kubernetes
/// millicores) so that any sequence of reserve/release sums exactly and balances to zero; a
/// double would drift (0.1 + 0.2 - 0.1 - 0.2 != 0) and make "never oversubscribe" flaky.
/// Memory is in bytes. A custom resource absent from the map is 0.
struct Resources {
  int64_t milliCpus = 0;
  int64_t milliGpus = 0;
  uint64_t memoryBytes = 0;
  /// Custom resources by name ("fpga", "nvme"), never holding a 0 entry, so that equality is
  /// structural.
  std::map<std::string, int64_t, std::less<>> milliCustom;

  /// Convenience constructor from whole or fractional units (rounded to the nearest thousandth).
  static Resources of(double cpus, double gpus = 0, uint64_t memoryBytes = 0);

  /// Sets a custom resource (rounded to the nearest thousandth); 0 removes it.
  Resources& withCustom(std::string_view name, double amount);

  double cpus() const { return milliCpus / 1000.0; }
  double gpus() const { return milliGpus / 1000.0; }
  /// The amount of a custom resource, 0 when absent.
  double custom(std::string_view name) const;
  int64_t milliCustomOf(std::string_view name) const;

  /// True when every amount here is <= the same amount in `available`.
  bool fitsIn(const Resources& available) const;

  /// True when every amount is 0.
  bool isZero() const;

  /// How many copies of `this` fit in `available` (the minimum over the requested dimensions).
  /// A zero request fits any number of times; the result is then `cap`.
  uint64_t countFitting(const Resources& available, uint64_t cap) const;

  /// Element-wise sum and difference. Subtraction requires `other.fitsIn(*this)` (a caller bug
  /// otherwise; throws std::logic_error) so that a Resources is never negative.
  Resources& operator+=(const Resources& other);
  Resources& operator-=(const Resources& other);

  /// "2 cpus, 1 gpu, 4 GiB memory, fpga=1" — for logs and error messages.
  std::string describe() const;

  bool operator==(const Resources&) const = default;
};

/// Converts a count of units to milli units, rounding to the nearest thousandth.
int64_t toMilli(double units);

/// "1", "0.5", "2.125": exact decimal text of a milli amount (no exponent, no trailing zeros).
std::string formatMilli(int64_t milli);

/// "512 MiB", "4 GiB", "1.5 GiB", "100 B": a byte count a person can read.
std::string formatBytes(uint64_t bytes);

}  // namespace troupe::sched
