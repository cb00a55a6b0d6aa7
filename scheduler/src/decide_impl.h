// Private: pieces shared by the decision functions (decide.cpp) and the messages that explain
// them (reasons.cpp).

#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/sched/decide.h"
#include "view_impl.h"

namespace troupe::sched::detail {

/// Capacity that earlier members of a gang take, not reserved in the view. Small (one entry per
/// member), so a linear search beats a map.
class Overlay {
 public:
  const Resources* find(NodeId id) const {
    for (const auto& [node, taken] : entries_) {
      if (node == id) return &taken;
    }
    return nullptr;
  }
  void add(NodeId id, const Resources& amount) {
    for (auto& [node, taken] : entries_) {
      if (node == id) {
        taken += amount;
        return;
      }
    }
    entries_.emplace_back(id, amount);
  }
  const std::vector<std::pair<NodeId, Resources>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<NodeId, Resources>> entries_;
};

/// True when `need` fits in the node's free capacity minus what `overlay` takes there. No
/// allocation: this runs for every candidate a decision looks at.
bool fits(const Node& node, const Resources& need, const Overlay* overlay);

/// The node's free capacity minus what `overlay` takes there.
Resources freeAfter(const Node& node, const Overlay* overlay);

/// Which groups a decision step may use.
using GroupFilter = std::function<bool(std::string_view group)>;

/// Unschedulable when the placement names a group the cluster does not know.
std::optional<Unschedulable> checkGroupsKnown(const ClusterView& view, const Placement& placement);

/// Wait when an expected host, or a JOINING node, of a group that passes `filter` might take the
/// placement. With `needFit` false any such host counts (placeMany: "every node" must include it).
std::optional<Wait> waitForJoins(const ClusterView& view, const Placement& placement,
                                 const GroupFilter& filter, bool needFit);

/// Why no ALIVE node in the groups that pass `filter` takes the placement: names the constraint,
/// the candidates and their free capacity.
Unschedulable explainNoFit(const ClusterView& view, const Placement& placement,
                           const GroupFilter& filter, const Overlay* overlay);

}  // namespace troupe::sched::detail
