// File: troupe/sched/decide.h
//
// Decisions: pure functions from (ClusterView, Placement) to an answer. They never change the
// view; the caller reserves `placement.getResources()` on each chosen node afterwards. Same input,
// same answer: ties are broken by node id.
//
// Errors are values. Unschedulable carries a reason a person can act on, naming the constraint,
// the candidates and their free capacity:
//   "no node in group 'dnn_group' has 1 free gpu: algo-3 has 0 of 1 free"
//   "group 'dnn_grup' is unknown; groups are: data_group, dnn_group"
// Wait means hosts the cluster description expects have not joined and the request might fit
// once they do; the runtime asks again when a node joins and bounds the wait with its join
// deadline (then ClusterView::forgetExpected() turns the answer into Placed or Unschedulable).

#pragma once

#include <span>
#include <string>
#include <variant>
#include <vector>

#include "troupe/sched/cluster_view.h"
#include "troupe/sched/placement.h"

namespace troupe::sched {

/// Start the actor on `nodeId`.
struct Placed {
  NodeId nodeId;
  bool operator==(const Placed&) const = default;
};

/// Cannot place now.
struct Unschedulable {
  std::string reason;
  /// True when an eligible node has the capacity in total and only lacks it free right now:
  /// stopping other actors would make room, so the runtime may queue instead of failing.
  bool fitsWhenFree = false;
  bool operator==(const Unschedulable&) const = default;
};

/// Ask again when one of `hosts` joins.
struct Wait {
  std::string reason;
  std::vector<std::string> hosts;  // the expected hosts that may take the request
  bool operator==(const Wait&) const = default;
};

/// One node id per actor to start: for placeMany, grouped by node in id order; for gang, in the
/// order of the placements.
struct PlacedMany {
  std::vector<NodeId> nodeIds;
  bool operator==(const PlacedMany&) const = default;
};

using Decision = std::variant<Placed, Unschedulable, Wait>;
using ManyDecision = std::variant<PlacedMany, Unschedulable, Wait>;

/// Chooses a node for one actor. For a multi-instance placement it decides one instance (use
/// placeMany for all of them).
Decision place(const ClusterView& view, const Placement& placement);

/// Decides every actor of a multi-instance placement (onePerNode, perNode, perVcpu), accounting
/// for the capacity the earlier ones take; a single-instance placement yields a list of one.
/// Eligible nodes are those of the first preferred group that has a node that fits (or all that
/// pass the hard constraints). Nodes without room are skipped; no room anywhere is
/// Unschedulable. Expected hosts that would be eligible and have not joined give Wait, because
/// "every node" must include them.
ManyDecision placeMany(const ClusterView& view, const Placement& placement);

/// All or nothing: one node per placement, each decided after the capacity the earlier ones take
/// (spread then really spreads a gang). Any member Unschedulable or Wait makes the whole gang so,
/// with the member's index in the reason. Multi-instance members are a caller bug
/// (std::invalid_argument).
ManyDecision gang(const ClusterView& view, std::span<const Placement> placements);

/// "placed on node 3", "unschedulable: ...", "wait: ..." — for logs.
std::string describe(const Decision& decision);
std::string describe(const ManyDecision& decision);

}  // namespace troupe::sched
