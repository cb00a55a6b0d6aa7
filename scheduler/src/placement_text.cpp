// Placement <-> text. The text is the builder chain, so what a log or the wire shows is what the
// app wrote: "prefer(data_group).perVcpu()", "group(dnn_group).gpus(1)".

#include <algorithm>
#include <array>

#include "text_cursor.h"
#include "troupe/sched/placement.h"

namespace troupe::sched {

using detail::ParseError;
using detail::TextCursor;

std::string Placement::toText() const {
  std::string out;
  auto call = [&](std::string_view name, const std::string& args) {
    out += (out.empty() ? "" : ".") + std::string(name) + "(" + args + ")";
  };
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  bool countDone = false;
  if (!groups_.empty()) {
    call(groups_.size() == 1 ? "group" : "groups", list(groups_));
  } else if (!preferred_.empty()) {
    call("prefer", preferred_[0]);
  } else if (count_ == Count::PER_NODE && perNode_ == 1) {
    call("onePerNode", "");
    countDone = true;
  } else {
    call("any", "");
  }
  for (size_t i = groups_.empty() ? 1 : 0; i < preferred_.size(); ++i) {
    call("thenPrefer", preferred_[i]);
  }
  for (const auto& g : excluded_) call("notGroup", g);
  if (resources_.milliCpus != 1000) call("cpus", formatMilli(resources_.milliCpus));
  if (resources_.milliGpus != 0) call("gpus", formatMilli(resources_.milliGpus));
  if (resources_.memoryBytes != 0) call("memory", std::to_string(resources_.memoryBytes));
  for (const auto& [name, amount] : resources_.milliCustom) {
    call("resource", name + ", " + formatMilli(amount));
  }
  if (strategy_ == Strategy::PACK) call("pack", "");
  if (!selector_.empty()) call("labels", "\"" + selector_.toText() + "\"");
  if (!countDone && count_ == Count::PER_NODE) call("perNode", std::to_string(perNode_));
  if (count_ == Count::PER_VCPU) call("perVcpu", "");
  return out;
}

namespace {

constexpr std::array kCalls = {
    "any",    "group",    "groups", "prefer", "thenPrefer", "notGroup", "cpus",       "gpus",
    "memory", "resource", "spread", "pack",   "labels",     "perNode",  "onePerNode", "perVcpu"};

/// A decimal amount with at most three fractional digits, read exactly into milli units.
int64_t parseMilli(TextCursor& in) {
  std::string_view text = in.name();
  size_t start = in.position() - text.size();
  int64_t whole = 0, frac = 0;
  size_t i = 0, digits = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    whole = whole * 10 + (text[i] - '0');
    if (whole > 1'000'000'000'000) in.failAt(start, "amount is too large");
  }
  if (i == 0) in.failAt(start, "expected an amount like 1 or 0.5");
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, ++digits) {
      if (digits == 3) in.failAt(start + i, "amounts have at most 3 decimals");
      frac = frac * 10 + (text[i] - '0');
    }
    if (digits == 0) in.failAt(start + i, "expected a digit");
  }
  if (i != text.size()) in.failAt(start + i, "expected an amount like 1 or 0.5");
  while (digits++ < 3) frac *= 10;
  return whole * 1000 + frac;
}

uint64_t parseCount(TextCursor& in, uint64_t max) {
  std::string_view text = in.name();
  size_t start = in.position() - text.size();
  uint64_t value = 0;
  if (text.empty()) in.failAt(start, "expected a whole number");
  for (char c : text) {
    if (c < '0' || c > '9') in.failAt(start, "expected a whole number");
    if (value > (max - (c - '0')) / 10) in.failAt(start, "number is too large");
    value = value * 10 + (c - '0');
  }
  return value;
}

std::vector<std::string> parseNames(TextCursor& in, std::string_view kind) {
  std::vector<std::string> names;
  do {
    names.push_back(in.requireName(kind));
  } while (in.consume(","));
  return names;
}

}  // namespace

namespace detail {

struct PlacementText {
  static void addGroups(Placement& p, const std::vector<std::string>& names) {
    Placement g = Placement::groups(names);
    for (const auto& n : g.groups_) {
      auto it = std::lower_bound(p.groups_.begin(), p.groups_.end(), n);
      if (it == p.groups_.end() || *it != n) p.groups_.insert(it, n);
    }
  }
};

}  // namespace detail

namespace {

void applyCall(TextCursor& in, std::string_view call, Placement& p) {
  if (call == "group" || call == "groups") {
    detail::PlacementText::addGroups(p, parseNames(in, "a group name"));
  } else if (call == "prefer" || call == "thenPrefer") {
    for (const auto& g : parseNames(in, "a group name")) p = p.thenPrefer(g);
  } else if (call == "notGroup") {
    for (const auto& g : parseNames(in, "a group name")) p = p.notGroup(g);
  } else if (call == "cpus") {
    p = p.cpus(double(parseMilli(in)) / 1000.0);
  } else if (call == "gpus") {
    p = p.gpus(double(parseMilli(in)) / 1000.0);
  } else if (call == "memory") {
    p = p.memory(parseCount(in, UINT64_MAX));
  } else if (call == "resource") {
    std::string name = in.requireName("a resource name");
    in.expect(",");
    p = p.resource(name, double(parseMilli(in)) / 1000.0);
  } else if (call == "spread") {
    p = p.spread();
  } else if (call == "pack") {
    p = p.pack();
  } else if (call == "labels") {
    in.expect("\"");
    size_t start = in.position();
    size_t end = in.text().find('"', start);
    if (end == std::string_view::npos) in.failAt(in.text().size(), "expected '\"'");
    auto selector = LabelSelector::parse(in.text().substr(start, end - start));
    if (!selector) in.failAt(start, "bad labels (" + selector.error + ")");
    in.setPosition(end + 1);
    p = p.labels(*selector);
  } else if (call == "perNode") {
    size_t at = in.position();
    uint64_t n = parseCount(in, UINT32_MAX);
    if (n == 0) in.failAt(at, "perNode needs at least 1");
    p = p.perNode(uint32_t(n));
  } else if (call == "onePerNode") {
    p = p.perNode(1);
  } else if (call == "perVcpu") {
    p = p.perVcpu();
  }
}

}  // namespace

Placement::ParseResult Placement::parse(std::string_view text) {
  TextCursor in("placement", text);
  Placement p;
  try {
    do {
      std::string_view call = in.name();
      if (call.empty()) in.fail("expected a call like group(dnn_group)");
      if (std::find(kCalls.begin(), kCalls.end(), call) == kCalls.end()) {
        std::string known;
        for (const char* c : kCalls) known += (known.empty() ? "" : ", ") + std::string(c);
        in.failAt(in.position() - call.size(),
                  "unknown call '" + std::string(call) + "' (calls are: " + known + ")");
      }
      in.expect("(");
      if (!in.consume(")")) {
        applyCall(in, call, p);
        if (!in.consume(")")) in.fail("expected ')'");
      } else if (call != "any" && call != "spread" && call != "pack" && call != "onePerNode" &&
                 call != "perVcpu") {
        in.failAt(in.position() - 1, "'" + std::string(call) + "' needs an argument");
      } else {
        applyCall(in, call, p);
      }
    } while (in.consume("."));
    if (!in.atEnd()) in.fail("expected '.' or the end");
  } catch (const ParseError& e) {
    return {std::nullopt, e.what()};
  }
  return {std::move(p), {}};
}

Placement Placement::fromText(std::string_view text) {
  auto parsed = parse(text);
  if (!parsed) throw std::invalid_argument(parsed.error);
  return *parsed;
}

}  // namespace troupe::sched
