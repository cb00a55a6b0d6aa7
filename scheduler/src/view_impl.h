// Private: the ClusterView's storage and its index, shared with the decision functions.
//
// Per group, ALIVE nodes sit in ordered sets keyed by free capacity of one dimension (cpu for
// every node, gpu for nodes that have gpus), once ascending (pack: the least free that still
// fits is a lower_bound) and once descending (spread: the most free is the first). Both orders
// break ties by node id, so decisions are deterministic. A decision walks one set per candidate
// group from the best end and stops at the first node that also fits the other dimensions and
// the label selector; for requests that only a few nodes match that walk is the price of not
// indexing every label (TODO(perf): index labels a selector pins, like instance_type).

#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "troupe/sched/cluster_view.h"

namespace troupe::sched::detail {

struct FreeKey {
  int64_t free;
  NodeId id;
  const Node* node;  // stable: nodes live in a std::map
};

struct Ascending {
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    return a.free < b.free || (a.free == b.free && a.id < b.id);
  }
};

struct Descending {
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    return a.free > b.free || (a.free == b.free && a.id < b.id);
  }
};

/// One dimension's free capacity in both orders.
struct DimIndex {
  std::set<FreeKey, Ascending> ascending;
  std::set<FreeKey, Descending> descending;

  void insert(const FreeKey& key) {
    ascending.insert(key);
    descending.insert(key);
  }
  void erase(const FreeKey& key) {
    ascending.erase(key);
    descending.erase(key);
  }
};

struct GroupIndex {
  std::set<NodeId> members;  // every node of the group, any state, in id order
  DimIndex cpu;              // ALIVE nodes
  DimIndex gpu;              // ALIVE nodes with gpu capacity
};

struct ViewImpl {
  std::map<NodeId, Node> nodes;
  std::map<std::string, NodeId, std::less<>> byHost;
  std::map<std::string, GroupIndex, std::less<>> groups;
  std::vector<ExpectedHost> expected;

  /// Adds the node's keys to its group's index when it is ALIVE.
  void index(const Node& node);
  /// Removes them (call before changing reserved, capacity or state).
  void unindex(const Node& node);
  /// Rebuilds every index from `nodes` (after a copy: keys point at nodes).
  void reindexAll();

  Node& require(NodeId id);
};

inline int64_t freeMilliCpus(const Node& n) {
  return n.capacity.milliCpus - n.reserved.milliCpus;
}
inline int64_t freeMilliGpus(const Node& n) {
  return n.capacity.milliGpus - n.reserved.milliGpus;
}

}  // namespace troupe::sched::detail
