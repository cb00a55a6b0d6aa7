// File: troupe/sched/cluster_view.h
//
// ClusterView: the scheduler's picture of the cluster — every node's labels, capacity, what is
// reserved on it and its state, plus the hosts the cluster description expects that have not
// joined yet. The head owns one and keeps it current (nodes join and are lost; actors start and
// stop); decisions (decide.h) read it. Not thread-safe: one owner, one thread.
//
// Nodes are indexed by group and free capacity so a decision looks at a few nodes, not all.

#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/sched/resources.h"
#include "troupe/sched/selector.h"

namespace troupe::sched {

/// JOINING: announced, not yet ready. ALIVE: takes placements. LOST: gone (its reservations
/// stay on the books until the runtime releases them).
enum class NodeState : uint8_t { JOINING, ALIVE, LOST };

/// "JOINING", "ALIVE", "LOST".
std::string_view toString(NodeState state);

/// What a node declares when it joins.
struct NodeSpec {
  NodeId id = 0;
  std::string host;          // "algo-1"
  std::string group;         // "data_group"
  std::string instanceType;  // "ml.c5.9xlarge"
  /// User labels. `group`, `instance_type` and `host` are added from the fields above.
  Labels labels;
  /// Overrides the instance table (bare metal, `troupe sim` CPU sets, unknown types).
  std::optional<Resources> capacity;
};

/// A node as the view knows it.
struct Node {
  NodeId id = 0;
  std::string host;
  std::string group;
  std::string instanceType;
  Labels labels;  // includes group, instance_type, host
  Resources capacity;
  Resources reserved;
  NodeState state = NodeState::JOINING;

  /// capacity - reserved.
  Resources free() const;
};

/// A host the cluster description names (resourceconfig.json), before it joins.
struct ExpectedHost {
  std::string host;
  std::string group;
  std::string instanceType;
};

namespace detail {
struct ViewImpl;
}

class ClusterView {
 public:
  ClusterView();
  ~ClusterView();
  ClusterView(const ClusterView& other);
  ClusterView& operator=(const ClusterView& other);
  ClusterView(ClusterView&&) noexcept;
  ClusterView& operator=(ClusterView&&) noexcept;

  // ---------------------------------------------------------------------------------------------
  // Membership

  /// Records a host the cluster description names. While expected hosts have not joined, a
  /// request that might fit on them gets Wait instead of Unschedulable. A host that has already
  /// joined is ignored.
  void expectHost(ExpectedHost host);
  /// Stops waiting for a host (the runtime's join deadline passed).
  void forgetExpected(std::string_view host);
  void forgetAllExpected();
  /// Expected hosts that have not joined, in the order they were named.
  const std::vector<ExpectedHost>& getExpectedHosts() const;

  /// Adds a node. Its capacity is `spec.capacity`, or else the instance table's row for
  /// `spec.instanceType`. Throws std::invalid_argument when the id or host is taken, the type is
  /// unknown and no capacity is given, or user labels contradict group / instance_type / host.
  /// Joining removes the host from the expected list.
  const Node& addNode(NodeSpec spec, NodeState state = NodeState::ALIVE);
  /// Moves a node between JOINING, ALIVE and LOST. Only ALIVE nodes take placements.
  void setState(NodeId id, NodeState state);
  /// Replaces a node's capacity (e.g. it reported its real size). Throws std::logic_error when
  /// the new capacity is below what is reserved.
  void setCapacity(NodeId id, const Resources& capacity);
  /// Forgets a node entirely, reservations included.
  void removeNode(NodeId id);

  // ---------------------------------------------------------------------------------------------
  // Books

  /// Takes `amount` from a node's free capacity. Returns false, changing nothing, when the node
  /// is not ALIVE or the amount does not fit: the view is never oversubscribed. Throws
  /// std::invalid_argument for an unknown node.
  [[nodiscard]] bool reserve(NodeId id, const Resources& amount);
  /// Gives `amount` back (an actor stopped, or is being restarted elsewhere). Works in every
  /// state, so a LOST node's books can be settled. Releasing more than is reserved is a caller
  /// bug: throws std::logic_error and changes nothing.
  void release(NodeId id, const Resources& amount);

  // ---------------------------------------------------------------------------------------------
  // Reading

  /// The node, or nullptr.
  const Node* findNode(NodeId id) const;
  /// The node on `host`, or nullptr.
  const Node* findHost(std::string_view host) const;
  /// All nodes, in id order.
  std::vector<const Node*> getNodes() const;
  size_t size() const;

  /// Every group a node (in any state) or an expected host belongs to, sorted.
  std::vector<std::string> getGroupNames() const;
  bool hasGroup(std::string_view group) const;

  /// For the decision functions in decide.h; not part of the API.
  const detail::ViewImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::ViewImpl> impl_;
};

}  // namespace troupe::sched
