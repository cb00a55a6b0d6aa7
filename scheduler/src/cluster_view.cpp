#include "troupe/sched/cluster_view.h"

#include <algorithm>
#include <stdexcept>

#include "troupe/sched/instance_types.h"
#include "view_impl.h"

namespace troupe::sched {

using detail::FreeKey;
using detail::ViewImpl;

std::string_view toString(NodeState state) {
  switch (state) {
    case NodeState::JOINING:
      return "JOINING";
    case NodeState::ALIVE:
      return "ALIVE";
    case NodeState::LOST:
      return "LOST";
  }
  return "?";
}

Resources Node::free() const {
  Resources out = capacity;
  out -= reserved;
  return out;
}

// -- index ----------------------------------------------------------------------------------------

void ViewImpl::index(const Node& node) {
  auto& group = groups[node.group];
  group.members.insert(node.id);
  if (node.state != NodeState::ALIVE) return;
  group.cpu.insert({detail::freeMilliCpus(node), node.id, &node});
  if (node.capacity.milliGpus > 0) group.gpu.insert({detail::freeMilliGpus(node), node.id, &node});
}

void ViewImpl::unindex(const Node& node) {
  auto it = groups.find(node.group);
  if (it == groups.end() || node.state != NodeState::ALIVE) return;
  it->second.cpu.erase({detail::freeMilliCpus(node), node.id, &node});
  if (node.capacity.milliGpus > 0) {
    it->second.gpu.erase({detail::freeMilliGpus(node), node.id, &node});
  }
}

void ViewImpl::reindexAll() {
  groups.clear();
  for (const auto& [id, node] : nodes) index(node);
}

Node& ViewImpl::require(NodeId id) {
  auto it = nodes.find(id);
  if (it == nodes.end()) throw std::invalid_argument("node " + std::to_string(id) + " is unknown");
  return it->second;
}

// -- ClusterView ----------------------------------------------------------------------------------

ClusterView::ClusterView() : impl_(std::make_unique<ViewImpl>()) {}
ClusterView::~ClusterView() = default;
ClusterView::ClusterView(ClusterView&&) noexcept = default;
ClusterView& ClusterView::operator=(ClusterView&&) noexcept = default;

ClusterView::ClusterView(const ClusterView& other) : impl_(std::make_unique<ViewImpl>()) {
  *this = other;
}

ClusterView& ClusterView::operator=(const ClusterView& other) {
  if (this == &other) return *this;
  auto copy = std::make_unique<ViewImpl>();
  copy->nodes = other.impl_->nodes;
  copy->byHost = other.impl_->byHost;
  copy->expected = other.impl_->expected;
  copy->reindexAll();
  impl_ = std::move(copy);
  return *this;
}

void ClusterView::expectHost(ExpectedHost host) {
  if (impl_->byHost.count(host.host)) return;
  auto& expected = impl_->expected;
  auto same = [&](const ExpectedHost& e) { return e.host == host.host; };
  if (std::none_of(expected.begin(), expected.end(), same)) expected.push_back(std::move(host));
}

void ClusterView::forgetExpected(std::string_view host) {
  std::erase_if(impl_->expected, [&](const ExpectedHost& e) { return e.host == host; });
}

void ClusterView::forgetAllExpected() {
  impl_->expected.clear();
}

const std::vector<ExpectedHost>& ClusterView::getExpectedHosts() const {
  return impl_->expected;
}

const Node& ClusterView::addNode(NodeSpec spec, NodeState state) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("cannot add node " + std::to_string(spec.id) + " (" + spec.host +
                                "): " + why);
  };
  if (impl_->nodes.count(spec.id)) fail("the id is taken");
  if (impl_->byHost.count(spec.host)) fail("host '" + spec.host + "' is already a node");
  if (spec.host.empty() || spec.group.empty()) fail("host and group must not be empty");
  Node node;
  if (spec.capacity) {
    node.capacity = *spec.capacity;
  } else if (auto type = findInstanceType(spec.instanceType)) {
    node.capacity = type->capacity();
  } else {
    fail("instance type '" + spec.instanceType + "' is not in the table; give a capacity");
  }
  for (auto [key, value] : {std::pair<const char*, const std::string&>{"group", spec.group},
                            {"instance_type", spec.instanceType},
                            {"host", spec.host}}) {
    auto it = spec.labels.find(key);
    if (it != spec.labels.end() && it->second != value) {
      fail("label " + std::string(key) + "=" + it->second + " contradicts the node's " + key +
           " '" + value + "'");
    }
    spec.labels.insert_or_assign(key, value);
  }
  node.id = spec.id;
  node.host = std::move(spec.host);
  node.group = std::move(spec.group);
  node.instanceType = std::move(spec.instanceType);
  node.labels = std::move(spec.labels);
  node.state = state;
  forgetExpected(node.host);
  impl_->byHost.emplace(node.host, node.id);
  const Node& stored = impl_->nodes.emplace(node.id, std::move(node)).first->second;
  impl_->index(stored);
  return stored;
}

void ClusterView::setState(NodeId id, NodeState state) {
  Node& node = impl_->require(id);
  impl_->unindex(node);
  node.state = state;
  impl_->index(node);
}

void ClusterView::setCapacity(NodeId id, const Resources& capacity) {
  Node& node = impl_->require(id);
  if (!node.reserved.fitsIn(capacity)) {
    throw std::logic_error("node " + node.host + ": capacity " + capacity.describe() +
                           " is below what is reserved (" + node.reserved.describe() + ")");
  }
  impl_->unindex(node);
  node.capacity = capacity;
  impl_->index(node);
}

void ClusterView::removeNode(NodeId id) {
  Node& node = impl_->require(id);
  impl_->unindex(node);
  auto group = impl_->groups.find(node.group);
  group->second.members.erase(id);
  if (group->second.members.empty()) impl_->groups.erase(group);
  impl_->byHost.erase(node.host);
  impl_->nodes.erase(id);
}

bool ClusterView::reserve(NodeId id, const Resources& amount) {
  Node& node = impl_->require(id);
  if (node.state != NodeState::ALIVE) return false;
  Resources after = node.reserved;
  after += amount;
  if (!after.fitsIn(node.capacity)) return false;
  impl_->unindex(node);
  node.reserved = std::move(after);
  impl_->index(node);
  return true;
}

void ClusterView::release(NodeId id, const Resources& amount) {
  Node& node = impl_->require(id);
  if (!amount.fitsIn(node.reserved)) {
    throw std::logic_error("release on " + node.host + " of " + amount.describe() +
                           " exceeds what is reserved (" + node.reserved.describe() + ")");
  }
  impl_->unindex(node);
  node.reserved -= amount;
  impl_->index(node);
}

const Node* ClusterView::findNode(NodeId id) const {
  auto it = impl_->nodes.find(id);
  return it == impl_->nodes.end() ? nullptr : &it->second;
}

const Node* ClusterView::findHost(std::string_view host) const {
  auto it = impl_->byHost.find(host);
  return it == impl_->byHost.end() ? nullptr : findNode(it->second);
}

std::vector<const Node*> ClusterView::getNodes() const {
  std::vector<const Node*> out;
  out.reserve(impl_->nodes.size());
  for (const auto& [id, node] : impl_->nodes) out.push_back(&node);
  return out;
}

size_t ClusterView::size() const {
  return impl_->nodes.size();
}

std::vector<std::string> ClusterView::getGroupNames() const {
  std::vector<std::string> names;
  for (const auto& [name, group] : impl_->groups) names.push_back(name);
  for (const auto& e : impl_->expected) names.push_back(e.group);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool ClusterView::hasGroup(std::string_view group) const {
  if (impl_->groups.count(group)) return true;
  return std::any_of(impl_->expected.begin(), impl_->expected.end(),
                     [&](const ExpectedHost& e) { return e.group == group; });
}

}  // namespace troupe::sched
