#include "troupe/sched/decide.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "decide_impl.h"

namespace troupe::sched {

namespace detail {

bool fits(const Node& node, const Resources& need, const Overlay* overlay) {
  const Resources* taken = overlay ? overlay->find(node.id) : nullptr;
  const Resources& cap = node.capacity;
  const Resources& used = node.reserved;
  if (cap.milliCpus - used.milliCpus - (taken ? taken->milliCpus : 0) < need.milliCpus) {
    return false;
  }
  if (cap.milliGpus - used.milliGpus - (taken ? taken->milliGpus : 0) < need.milliGpus) {
    return false;
  }
  uint64_t memoryUsed = used.memoryBytes + (taken ? taken->memoryBytes : 0);
  if (memoryUsed > cap.memoryBytes || cap.memoryBytes - memoryUsed < need.memoryBytes) {
    return false;
  }
  for (const auto& [name, amount] : need.milliCustom) {
    int64_t free = cap.milliCustomOf(name) - used.milliCustomOf(name) -
                   (taken ? taken->milliCustomOf(name) : 0);
    if (free < amount) return false;
  }
  return true;
}

Resources freeAfter(const Node& node, const Overlay* overlay) {
  Resources free = node.free();
  if (const Resources* taken = overlay ? overlay->find(node.id) : nullptr) free -= *taken;
  return free;
}

}  // namespace detail

namespace {

using detail::FreeKey;
using detail::GroupFilter;
using detail::GroupIndex;
using detail::Overlay;

/// The best node found so far under the placement's strategy.
class Best {
 public:
  explicit Best(Placement::Strategy strategy) : spread_(strategy == Placement::Strategy::SPREAD) {}

  void consider(int64_t free, NodeId id) {
    bool better = !found_ || (spread_ ? free > free_ : free < free_) || (free == free_ && id < id_);
    if (better) {
      found_ = true;
      free_ = free;
      id_ = id;
    }
  }
  bool found() const { return found_; }
  NodeId id() const { return id_; }

 private:
  bool spread_;
  bool found_ = false;
  int64_t free_ = 0;
  NodeId id_ = 0;
};

/// One decision step: the placement's need, its dominant dimension and the gang overlay.
class Search {
 public:
  Search(const ClusterView& view, const Placement& placement, const Overlay* overlay)
      : view_(view),
        placement_(placement),
        need_(placement.getResources()),
        overlay_(overlay),
        byGpu_(need_.milliGpus > 0),
        key_(byGpu_ ? need_.milliGpus : need_.milliCpus) {}

  /// The best ALIVE node of the groups that pass `filter`, or nothing.
  std::optional<NodeId> best(const GroupFilter& filter) const {
    Best best(placement_.getStrategy());
    for (const auto& [name, group] : view_.impl().groups) {
      if (filter(name)) searchGroup(group, best);
    }
    if (overlay_) searchOverlay(filter, best);
    if (!best.found()) return std::nullopt;
    return best.id();
  }

 private:
  bool accept(const FreeKey& key) const {
    if (overlay_ && overlay_->find(key.id)) return false;  // searchOverlay sees it with its load
    return detail::fits(*key.node, need_, nullptr) &&
           placement_.getSelector().matches(key.node->labels);
  }

  // Walks the group's index from the best end; the first node that fits is the group's best.
  void searchGroup(const GroupIndex& group, Best& best) const {
    const detail::DimIndex& dim = byGpu_ ? group.gpu : group.cpu;
    if (placement_.getStrategy() == Placement::Strategy::SPREAD) {
      for (const FreeKey& key : dim.descending) {
        if (key.free < key_) break;
        if (accept(key)) {
          best.consider(key.free, key.id);
          return;
        }
      }
    } else {
      for (auto it = dim.ascending.lower_bound({key_, 0, nullptr}); it != dim.ascending.end();
           ++it) {
        if (accept(*it)) {
          best.consider(it->free, it->id);
          return;
        }
      }
    }
  }

  // Nodes an earlier gang member took capacity from, ranked by what is left after it.
  void searchOverlay(const GroupFilter& filter, Best& best) const {
    for (const auto& [id, taken] : overlay_->entries()) {
      const Node* node = view_.findNode(id);
      if (!node || node->state != NodeState::ALIVE || !filter(node->group)) continue;
      if (!detail::fits(*node, need_, overlay_)) continue;
      if (!placement_.getSelector().matches(node->labels)) continue;
      int64_t free = byGpu_ ? detail::freeMilliGpus(*node) - taken.milliGpus
                            : detail::freeMilliCpus(*node) - taken.milliCpus;
      best.consider(free, id);
    }
  }

  const ClusterView& view_;
  const Placement& placement_;
  const Resources& need_;
  const Overlay* overlay_;
  bool byGpu_;
  int64_t key_;
};

/// Hard group constraints: groups / notGroup, and a selector that pins the `group` label.
GroupFilter hardFilter(const Placement& placement) {
  auto pinned = placement.getSelector().allowedValues("group");
  return [&placement, pinned = std::move(pinned)](std::string_view group) {
    if (!placement.allowsGroup(group)) return false;
    return !pinned || std::binary_search(pinned->begin(), pinned->end(), group);
  };
}

GroupFilter only(const GroupFilter& hard, std::string_view preferred) {
  return [&hard, preferred](std::string_view group) { return group == preferred && hard(group); };
}

Decision decide(const ClusterView& view, const Placement& placement, const Overlay* overlay) {
  if (auto unknown = detail::checkGroupsKnown(view, placement)) return *unknown;
  GroupFilter hard = hardFilter(placement);
  Search search(view, placement, overlay);
  for (const auto& preferred : placement.getPreferred()) {
    if (!hard(preferred)) continue;
    GroupFilter tier = only(hard, preferred);
    if (auto id = search.best(tier)) return Placed{*id};
    // A preferred group still joining is worth waiting for: falling back now would put the
    // job's augmenters on its GPU nodes for good because the data nodes booted a little later.
    if (auto wait = detail::waitForJoins(view, placement, tier, true)) return *wait;
  }
  if (auto id = search.best(hard)) return Placed{*id};
  if (auto wait = detail::waitForJoins(view, placement, hard, true)) return *wait;
  return detail::explainNoFit(view, placement, hard, overlay);
}

/// Actors per node for a multi-instance placement over the groups that pass `filter`.
std::vector<NodeId> fill(const ClusterView& view, const Placement& placement,
                         const GroupFilter& filter) {
  std::vector<const Node*> eligible;
  for (const auto& [name, group] : view.impl().groups) {
    if (!filter(name)) continue;
    for (NodeId id : group.members) {
      const Node* node = view.findNode(id);
      if (node->state == NodeState::ALIVE && placement.getSelector().matches(node->labels)) {
        eligible.push_back(node);
      }
    }
  }
  std::sort(eligible.begin(), eligible.end(),
            [](const Node* a, const Node* b) { return a->id < b->id; });
  std::vector<NodeId> ids;
  const Resources& need = placement.getResources();
  for (const Node* node : eligible) {
    Resources free = node->free();
    uint64_t cap = placement.getCount() == Placement::Count::PER_VCPU
                       ? uint64_t(std::max<int64_t>(free.milliCpus, 0) / 1000)
                       : placement.getPerNode();
    uint64_t count = need.countFitting(free, cap);
    ids.insert(ids.end(), count, node->id);
  }
  return ids;
}

ManyDecision widen(Decision decision) {
  return std::visit(
      [](auto&& d) -> ManyDecision {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, Placed>) {
          return PlacedMany{{d.nodeId}};
        } else {
          return std::move(d);
        }
      },
      std::move(decision));
}

}  // namespace

Decision place(const ClusterView& view, const Placement& placement) {
  return decide(view, placement, nullptr);
}

ManyDecision placeMany(const ClusterView& view, const Placement& placement) {
  if (!placement.isMultiInstance()) return widen(place(view, placement));
  if (auto unknown = detail::checkGroupsKnown(view, placement)) return *unknown;
  GroupFilter hard = hardFilter(placement);
  for (const auto& preferred : placement.getPreferred()) {
    if (!hard(preferred)) continue;
    GroupFilter tier = only(hard, preferred);
    if (auto wait = detail::waitForJoins(view, placement, tier, false)) return *wait;
    if (auto ids = fill(view, placement, tier); !ids.empty()) return PlacedMany{std::move(ids)};
  }
  if (auto wait = detail::waitForJoins(view, placement, hard, false)) return *wait;
  if (auto ids = fill(view, placement, hard); !ids.empty()) return PlacedMany{std::move(ids)};
  return detail::explainNoFit(view, placement, hard, nullptr);
}

ManyDecision gang(const ClusterView& view, std::span<const Placement> placements) {
  for (size_t i = 0; i < placements.size(); ++i) {
    if (placements[i].isMultiInstance()) {
      throw std::invalid_argument("gang member " + std::to_string(i) + " (" +
                                  placements[i].toText() +
                                  ") is multi-instance; a gang takes single-instance placements");
    }
  }
  Overlay overlay;
  PlacedMany placed;
  for (size_t i = 0; i < placements.size(); ++i) {
    Decision d = decide(view, placements[i], &overlay);
    std::string prefix = "gang member " + std::to_string(i) + " of " +
                         std::to_string(placements.size()) + " (" + placements[i].toText() + "): ";
    if (auto* u = std::get_if<Unschedulable>(&d))
      return Unschedulable{prefix + u->reason, u->fitsWhenFree};
    if (auto* w = std::get_if<Wait>(&d)) return Wait{prefix + w->reason, std::move(w->hosts)};
    NodeId id = std::get<Placed>(d).nodeId;
    overlay.add(id, placements[i].getResources());
    placed.nodeIds.push_back(id);
  }
  return placed;
}

std::string describe(const Decision& decision) {
  return describe(widen(decision));
}

std::string describe(const ManyDecision& decision) {
  if (auto* p = std::get_if<PlacedMany>(&decision)) {
    std::string out = p->nodeIds.size() == 1 ? "placed on node " : "placed on nodes ";
    for (size_t i = 0; i < p->nodeIds.size(); ++i) {
      out += (i ? ", " : "") + std::to_string(p->nodeIds[i]);
    }
    return out;
  }
  if (auto* u = std::get_if<Unschedulable>(&decision)) return "unschedulable: " + u->reason;
  return "wait: " + std::get<Wait>(decision).reason;
}

}  // namespace troupe::sched
