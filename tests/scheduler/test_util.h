// Plain-data clusters for the scheduler tests.

#pragma once

#include <string>
#include <variant>

#include "troupe/sched/sched.h"

namespace troupe::sched::test {

constexpr uint64_t kGiB = 1ull << 30;

/// Adds an ALIVE node of a known instance type.
inline const Node& addNode(ClusterView& view, NodeId id, std::string host, std::string group,
                           std::string type, Labels labels = {}) {
  NodeSpec spec;
  spec.id = id;
  spec.host = std::move(host);
  spec.group = std::move(group);
  spec.instanceType = std::move(type);
  spec.labels = std::move(labels);
  return view.addNode(std::move(spec));
}

/// The seeds' shape: two c5.xlarge data nodes (4 vCPU) and one p3.2xlarge dnn node (8 vCPU, 1 GPU).
inline ClusterView heteroCluster() {
  ClusterView view;
  addNode(view, 1, "algo-1", "data_group", "ml.c5.xlarge");
  addNode(view, 2, "algo-2", "data_group", "ml.c5.xlarge");
  addNode(view, 3, "algo-3", "dnn_group", "ml.p3.2xlarge");
  return view;
}

/// The node id of a Placed decision; fails the test otherwise.
inline NodeId placedOn(const Decision& d) {
  if (!std::holds_alternative<Placed>(d)) throw std::runtime_error("not placed: " + describe(d));
  return std::get<Placed>(d).nodeId;
}

inline std::string reasonOf(const Decision& d) {
  if (auto* u = std::get_if<Unschedulable>(&d)) return u->reason;
  if (auto* w = std::get_if<Wait>(&d)) return w->reason;
  return "placed";
}

inline std::string reasonOf(const ManyDecision& d) {
  if (auto* u = std::get_if<Unschedulable>(&d)) return u->reason;
  if (auto* w = std::get_if<Wait>(&d)) return w->reason;
  return "placed";
}

}  // namespace troupe::sched::test
