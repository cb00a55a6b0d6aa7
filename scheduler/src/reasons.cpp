// The messages behind Unschedulable and Wait. They are read by people, so they name the
// constraint, the candidates and what is free on them, sorted nearest-to-fitting first.

#include <algorithm>

#include "decide_impl.h"
#include "troupe/sched/instance_types.h"

namespace troupe::sched::detail {

namespace {

constexpr size_t kMaxListed = 5;  // candidates named in a message; the rest are counted

std::string joinQuoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

std::string joinPlain(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// " in group 'dnn_group' matching 'gpu=a100'" — the hard constraints, for a sentence.
std::string scopeText(const Placement& p, bool withSelector) {
  std::string out;
  if (!p.getGroups().empty()) {
    out += (p.getGroups().size() == 1 ? " in group " : " in groups ") + joinQuoted(p.getGroups());
  }
  if (!p.getExcludedGroups().empty()) out += " outside " + joinQuoted(p.getExcludedGroups());
  if (withSelector && !p.getSelector().empty()) {
    out += " matching '" + p.getSelector().toText() + "'";
  }
  return out;
}

/// "N more" tail for long lists.
std::string listWithTail(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > kMaxListed)
    out += " and " + std::to_string(items.size() - kMaxListed) + " more";
  return out;
}

/// One resource dimension of a request, for "has 1 free gpu" and "has 0 of 1 free".
struct Dim {
  enum Kind { CPU, GPU, MEMORY, CUSTOM } kind;
  std::string name;  // custom resource name

  int64_t amount(const Resources& r) const {
    switch (kind) {
      case CPU:
        return r.milliCpus;
      case GPU:
        return r.milliGpus;
      case MEMORY:
        return int64_t(std::min<uint64_t>(r.memoryBytes, INT64_MAX));
      case CUSTOM:
        return r.milliCustomOf(name);
    }
    return 0;
  }
  std::string quantity(int64_t v) const {
    return kind == MEMORY ? formatBytes(uint64_t(v)) : formatMilli(v);
  }
  std::string unit(int64_t v) const {
    switch (kind) {
      case CPU:
        return v == 1000 ? "cpu" : "cpus";
      case GPU:
        return v == 1000 ? "gpu" : "gpus";
      case MEMORY:
        return "memory";
      case CUSTOM:
        return name;
    }
    return "";
  }
  /// "1 free gpu", "2 GiB free memory".
  std::string needText(int64_t v) const {
    if (kind == MEMORY) return quantity(v) + " free memory";
    return quantity(v) + " free " + unit(v);
  }
};

std::vector<Dim> requestedDims(const Resources& need) {
  std::vector<Dim> dims;
  if (need.milliCpus > 0) dims.push_back({Dim::CPU, ""});
  if (need.milliGpus > 0) dims.push_back({Dim::GPU, ""});
  if (need.memoryBytes > 0) dims.push_back({Dim::MEMORY, ""});
  for (const auto& [name, amount] : need.milliCustom) dims.push_back({Dim::CUSTOM, name});
  return dims;
}

/// Checks the parts of a selector an expected host can answer before it joins: its group,
/// instance type and host. Requirements on user labels might hold, so they pass.
bool mightMatch(const LabelSelector& selector, const ExpectedHost& host) {
  Labels known{{"group", host.group}, {"instance_type", host.instanceType}, {"host", host.host}};
  for (const auto& r : selector.requirements()) {
    if (known.count(r.key) && !r.matches(known)) return false;
  }
  return true;
}

}  // namespace

std::optional<Unschedulable> checkGroupsKnown(const ClusterView& view, const Placement& placement) {
  for (const auto& group : placement.getGroups()) {
    if (!view.hasGroup(group)) {
      auto known = view.getGroupNames();
      return Unschedulable{"group '" + group + "' is unknown; groups are: " +
                           (known.empty() ? "(none yet)" : joinPlain(known))};
    }
  }
  return std::nullopt;
}

std::optional<Wait> waitForJoins(const ClusterView& view, const Placement& placement,
                                 const GroupFilter& filter, bool needFit) {
  const Resources& need = placement.getResources();
  std::vector<std::string> hosts, listed;
  for (const auto& e : view.getExpectedHosts()) {
    if (!filter(e.group) || !mightMatch(placement.getSelector(), e)) continue;
    auto type = findInstanceType(e.instanceType);
    if (needFit && type && !need.fitsIn(type->capacity())) continue;
    hosts.push_back(e.host);
    listed.push_back(e.host + " (" + e.group + ", " + e.instanceType + ")");
  }
  for (const auto& [name, group] : view.impl().groups) {
    if (!filter(name)) continue;
    for (NodeId id : group.members) {
      const Node* node = view.findNode(id);
      if (node->state != NodeState::JOINING) continue;
      if (!placement.getSelector().matches(node->labels)) continue;
      if (needFit && !fits(*node, need, nullptr)) continue;
      hosts.push_back(node->host);
      listed.push_back(node->host + " (" + node->group + ", " + node->instanceType + ", joining)");
    }
  }
  if (hosts.empty()) return std::nullopt;
  std::string what = needFit ? "no ALIVE node" + scopeText(placement, true) + " has " +
                                   need.describe() + " free yet"
                             : "placing " + placement.describe() + " needs every eligible node";
  std::string reason = what + "; waiting for " + std::to_string(hosts.size()) +
                       (hosts.size() == 1 ? " host" : " hosts") +
                       " to join: " + listWithTail(listed);
  return Wait{std::move(reason), std::move(hosts)};
}

Unschedulable explainNoFit(const ClusterView& view, const Placement& placement,
                           const GroupFilter& filter, const Overlay* overlay) {
  std::vector<const Node*> inGroups, matching, alive;
  for (const auto& [name, group] : view.impl().groups) {
    if (!filter(name)) continue;
    for (NodeId id : group.members) inGroups.push_back(view.findNode(id));
  }
  for (const Node* n : inGroups) {
    if (placement.getSelector().matches(n->labels)) matching.push_back(n);
  }
  for (const Node* n : matching) {
    if (n->state == NodeState::ALIVE) alive.push_back(n);
  }

  if (inGroups.empty()) {
    auto known = view.getGroupNames();
    return {"no node is" +
            (scopeText(placement, false).empty() ? std::string(" in the cluster")
                                                 : scopeText(placement, false)) +
            "; groups are: " + (known.empty() ? "(none yet)" : joinPlain(known))};
  }
  if (matching.empty()) {
    return {"no node" + scopeText(placement, false) + " matches labels '" +
            placement.getSelector().toText() + "' (" + std::to_string(inGroups.size()) +
            " nodes checked, e.g. " + inGroups[0]->host +
            " has instance_type=" + inGroups[0]->instanceType + ")"};
  }
  if (alive.empty()) {
    std::vector<std::string> states;
    for (const Node* n : matching)
      states.push_back(n->host + " is " + std::string(toString(n->state)));
    return {"no ALIVE node" + scopeText(placement, true) + ": " + listWithTail(states)};
  }

  // Every ALIVE candidate lacks something: name the dimensions that fail, then the candidates.
  const Resources& need = placement.getResources();
  std::vector<Dim> failing;
  for (const Dim& d : requestedDims(need)) {
    bool fails = std::any_of(alive.begin(), alive.end(), [&](const Node* n) {
      return d.amount(freeAfter(*n, overlay)) < d.amount(need);
    });
    if (fails) failing.push_back(d);
  }
  if (failing.empty()) failing = requestedDims(need);  // cannot happen; keep the message whole
  const Dim& lead = failing[0];
  std::stable_sort(alive.begin(), alive.end(), [&](const Node* a, const Node* b) {
    int64_t fa = lead.amount(freeAfter(*a, overlay)), fb = lead.amount(freeAfter(*b, overlay));
    return fa > fb || (fa == fb && a->id < b->id);
  });

  std::string header;
  for (size_t i = 0; i < failing.size(); ++i) {
    header += (i ? " and " : "") + failing[i].needText(failing[i].amount(need));
  }
  std::vector<std::string> lines;
  const Node* roomy = nullptr;
  for (const Node* n : alive) {
    Resources free = freeAfter(*n, overlay);
    std::string line;
    for (const Dim& d : failing) {
      int64_t f = d.amount(free), cap = d.amount(n->capacity);
      if (f >= d.amount(need)) continue;
      line += (line.empty() ? "" : " and ") + d.quantity(f) + " of " + d.quantity(cap) +
              (failing.size() == 1 ? " free" : " " + d.unit(cap) + " free");
    }
    lines.push_back(n->host + " has " + line);
    if (!roomy && need.fitsIn(n->capacity)) roomy = n;
  }
  std::string reason =
      "no node" + scopeText(placement, true) + " has " + header + ": " + listWithTail(lines);
  if (roomy) {
    reason += "; " + roomy->host + " has that much in total, so it fits once actors there stop";
  }
  return {std::move(reason), roomy != nullptr};
}

}  // namespace troupe::sched::detail
