#include "troupe/sched/resources.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace troupe::sched {

int64_t toMilli(double units) {
  return std::llround(units * 1000.0);
}

std::string formatMilli(int64_t milli) {
  std::string out = milli < 0 ? "-" : "";
  uint64_t magnitude = milli < 0 ? uint64_t(-(milli + 1)) + 1 : uint64_t(milli);
  out += std::to_string(magnitude / 1000);
  if (uint64_t frac = magnitude % 1000; frac != 0) {
    char digits[4];
    std::snprintf(digits, sizeof(digits), "%03u", unsigned(frac));
    std::string f = digits;
    while (f.back() == '0') f.pop_back();
    out += "." + f;
  }
  return out;
}

std::string formatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = double(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || value == std::floor(value)) {
    std::snprintf(buf, sizeof(buf), "%.0f %s", value, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

Resources Resources::of(double cpus, double gpus, uint64_t memoryBytes) {
  Resources r;
  r.milliCpus = toMilli(cpus);
  r.milliGpus = toMilli(gpus);
  r.memoryBytes = memoryBytes;
  return r;
}

Resources& Resources::withCustom(std::string_view name, double amount) {
  int64_t milli = toMilli(amount);
  if (milli == 0) {
    if (auto it = milliCustom.find(name); it != milliCustom.end()) milliCustom.erase(it);
  } else {
    milliCustom.insert_or_assign(std::string(name), milli);
  }
  return *this;
}

int64_t Resources::milliCustomOf(std::string_view name) const {
  auto it = milliCustom.find(name);
  return it == milliCustom.end() ? 0 : it->second;
}

double Resources::custom(std::string_view name) const {
  return milliCustomOf(name) / 1000.0;
}

bool Resources::fitsIn(const Resources& available) const {
  if (milliCpus > available.milliCpus || milliGpus > available.milliGpus ||
      memoryBytes > available.memoryBytes) {
    return false;
  }
  for (const auto& [name, amount] : milliCustom) {
    if (amount > available.milliCustomOf(name)) return false;
  }
  return true;
}

bool Resources::isZero() const {
  return milliCpus == 0 && milliGpus == 0 && memoryBytes == 0 && milliCustom.empty();
}

uint64_t Resources::countFitting(const Resources& available, uint64_t cap) const {
  uint64_t count = cap;
  auto limit = [&](uint64_t need, uint64_t have) {
    if (need > 0) count = std::min(count, have / need);
  };
  limit(uint64_t(std::max<int64_t>(milliCpus, 0)),
        uint64_t(std::max<int64_t>(available.milliCpus, 0)));
  limit(uint64_t(std::max<int64_t>(milliGpus, 0)),
        uint64_t(std::max<int64_t>(available.milliGpus, 0)));
  limit(memoryBytes, available.memoryBytes);
  for (const auto& [name, amount] : milliCustom) {
    limit(uint64_t(amount), uint64_t(std::max<int64_t>(available.milliCustomOf(name), 0)));
  }
  return count;
}

Resources& Resources::operator+=(const Resources& other) {
  milliCpus += other.milliCpus;
  milliGpus += other.milliGpus;
  memoryBytes += other.memoryBytes;
  for (const auto& [name, amount] : other.milliCustom) {
    int64_t& slot = milliCustom[name];
    slot += amount;
    if (slot == 0) milliCustom.erase(name);
  }
  return *this;
}

Resources& Resources::operator-=(const Resources& other) {
  if (!other.fitsIn(*this)) {
    throw std::logic_error("cannot subtract " + other.describe() + " from " + describe());
  }
  milliCpus -= other.milliCpus;
  milliGpus -= other.milliGpus;
  memoryBytes -= other.memoryBytes;
  for (const auto& [name, amount] : other.milliCustom) {
    auto it = milliCustom.find(name);
    it->second -= amount;
    if (it->second == 0) milliCustom.erase(it);
  }
  return *this;
}

static std::string plural(int64_t milli, const char* unit) {
  return formatMilli(milli) + " " + unit + (milli == 1000 ? "" : "s");
}

std::string Resources::describe() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  add(plural(milliCpus, "cpu"));
  if (milliGpus != 0) add(plural(milliGpus, "gpu"));
  if (memoryBytes != 0) add(formatBytes(memoryBytes) + " memory");
  for (const auto& [name, amount] : milliCustom) add(name + "=" + formatMilli(amount));
  return out;
}

}  // namespace troupe::sched
