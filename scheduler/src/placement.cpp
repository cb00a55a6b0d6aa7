#include "troupe/sched/placement.h"

#include <algorithm>
#include <stdexcept>

namespace troupe::sched {

namespace {

void insertSorted(std::vector<std::string>& names, std::string_view name) {
  auto it = std::lower_bound(names.begin(), names.end(), name);
  if (it == names.end() || *it != name) names.insert(it, std::string(name));
}

void requireName(std::string_view name, const char* what) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), isNameChar)) {
    throw std::invalid_argument(std::string(what) + " '" + std::string(name) +
                                "' is not a name: use letters, digits and . _ - /");
  }
}

int64_t requireAmount(double n, const char* what) {
  if (!(n >= 0) || n > 1e12) {
    throw std::invalid_argument(std::string(what) + "(" + std::to_string(n) +
                                ") needs an amount between 0 and 1e12");
  }
  return toMilli(n);
}

std::string quotedList(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

Placement::Placement() {
  resources_.milliCpus = 1000;
}

Placement::Chain Placement::any() {
  return Placement();
}

Placement::Chain Placement::group(std::string_view name) {
  return groups({std::string(name)});
}

Placement::Chain Placement::groups(const std::vector<std::string>& names) {
  Placement p;
  for (const auto& n : names) {
    requireName(n, "group");
    insertSorted(p.groups_, n);
  }
  return p;
}

Placement::Chain Placement::prefer(std::string_view name) {
  return Placement().thenPrefer(name);
}

Placement::Chain Placement::onePerNode() {
  return Placement().perNode(1);
}

Placement::Chain Placement::notGroup(std::string_view name) const {
  requireName(name, "group");
  Placement p = *this;
  insertSorted(p.excluded_, name);
  return p;
}

Placement::Chain Placement::thenPrefer(std::string_view name) const {
  requireName(name, "group");
  Placement p = *this;
  if (std::find(p.preferred_.begin(), p.preferred_.end(), name) == p.preferred_.end()) {
    p.preferred_.emplace_back(name);
  }
  return p;
}

Placement::Chain Placement::cpus(double n) const {
  Placement p = *this;
  p.resources_.milliCpus = requireAmount(n, "cpus");
  return p;
}

Placement::Chain Placement::gpus(double n) const {
  Placement p = *this;
  p.resources_.milliGpus = requireAmount(n, "gpus");
  return p;
}

Placement::Chain Placement::memory(uint64_t bytes) const {
  Placement p = *this;
  p.resources_.memoryBytes = bytes;
  return p;
}

Placement::Chain Placement::resource(std::string_view name, double n) const {
  requireName(name, "resource");
  Placement p = *this;
  p.resources_.withCustom(name, double(requireAmount(n, "resource")) / 1000.0);
  return p;
}

Placement::Chain Placement::spread() const {
  Placement p = *this;
  p.strategy_ = Strategy::SPREAD;
  return p;
}

Placement::Chain Placement::pack() const {
  Placement p = *this;
  p.strategy_ = Strategy::PACK;
  return p;
}

Placement::Chain Placement::labels(std::string_view selector) const {
  auto parsed = LabelSelector::parse(selector);
  if (!parsed) throw std::invalid_argument(parsed.error);
  return labels(*parsed);
}

Placement::Chain Placement::labels(const LabelSelector& selector) const {
  Placement p = *this;
  for (const auto& r : selector.requirements()) p.selector_.add(r);
  return p;
}

Placement::Chain Placement::perNode(uint32_t n) const {
  if (n == 0) throw std::invalid_argument("perNode(0): a node needs at least one actor");
  Placement p = *this;
  p.count_ = Count::PER_NODE;
  p.perNode_ = n;
  return p;
}

Placement::Chain Placement::perVcpu() const {
  Placement p = *this;
  p.count_ = Count::PER_VCPU;
  p.perNode_ = 1;
  return p;
}

bool Placement::allowsGroup(std::string_view group) const {
  if (!groups_.empty() && !std::binary_search(groups_.begin(), groups_.end(), group)) return false;
  return !std::binary_search(excluded_.begin(), excluded_.end(), group);
}

std::string Placement::describe() const {
  std::string out;
  switch (count_) {
    case Count::ONE:
      out = "1 actor";
      break;
    case Count::PER_NODE:
      out = std::to_string(perNode_) + (perNode_ == 1 ? " actor per node" : " actors per node");
      break;
    case Count::PER_VCPU:
      out = "as many actors as fit per node";
      break;
  }
  if (groups_.empty()) {
    out += " in any group";
  } else {
    out += (groups_.size() == 1 ? " in group " : " in groups ") + quotedList(groups_);
  }
  if (!excluded_.empty()) out += " except " + quotedList(excluded_);
  if (!selector_.empty()) out += " matching '" + selector_.toText() + "'";
  if (!preferred_.empty()) out += ", preferring " + quotedList(preferred_) + " in that order";
  out += ", each " + resources_.describe();
  out += strategy_ == Strategy::SPREAD ? ", spread" : ", pack";
  return out;
}

}  // namespace troupe::sched
