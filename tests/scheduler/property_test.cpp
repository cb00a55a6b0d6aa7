// Properties over random clusters and requests (fixed seed): decisions match a brute-force scan,
// hard constraints hold, capacity is never oversubscribed, books balance to zero, gangs are all
// or nothing, answers are deterministic, and every placement survives toText/parse.

#include <catch2/catch.hpp>

#include <random>

#include "test_util.h"

using namespace troupe::sched;
using namespace troupe::sched::test;

namespace {

/// Portable draws (the standard distributions differ between libraries).
struct Rng {
  std::mt19937_64 engine;
  explicit Rng(uint64_t seed) : engine(seed) {}
  uint64_t below(uint64_t n) { return engine() % n; }
  bool chance(int percent) { return below(100) < uint64_t(percent); }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }
};

const std::vector<std::string> kGroups{"data_group", "dnn_group", "g2", "g3", "g4"};
const std::vector<std::string> kTypes{"ml.c5.xlarge",  "ml.c5.2xlarge", "ml.c5.9xlarge",
                                      "ml.p3.2xlarge", "ml.p3.8xlarge", "ml.g5.xlarge",
                                      "ml.m5.xlarge"};
const std::vector<std::string> kZones{"a", "b", "c"};

ClusterView randomCluster(Rng& rng, bool withJoins) {
  ClusterView view;
  size_t groups = 1 + rng.below(kGroups.size());
  size_t n = 1 + rng.below(40);
  for (size_t i = 0; i < n; ++i) {
    NodeSpec spec;
    spec.id = NodeId(rng.below(1000) * 64 + i);  // unique, not in insertion order
    spec.host = "h" + std::to_string(spec.id);
    spec.group = kGroups[rng.below(groups)];
    spec.instanceType = rng.pick(kTypes);
    if (rng.chance(60)) spec.labels["zone"] = rng.pick(kZones);
    if (rng.chance(20))
      spec.capacity = Resources::of(double(rng.below(5)), double(rng.below(2)), rng.below(3) * kGiB)
                          .withCustom("fpga", double(rng.below(3)));
    NodeState state = NodeState::ALIVE;
    if (withJoins && rng.chance(10)) state = NodeState::JOINING;
    if (rng.chance(10)) state = NodeState::LOST;
    const Node& node = view.addNode(std::move(spec), state);
    if (state == NodeState::ALIVE && rng.chance(50)) {
      Resources r = Resources::of(double(rng.below(uint64_t(node.capacity.cpus()) + 1)));
      (void)view.reserve(node.id, r);
    }
  }
  if (withJoins && rng.chance(50)) {
    view.expectHost({"later", rng.pick(kGroups), rng.pick(kTypes)});
  }
  return view;
}

Placement randomPlacement(Rng& rng, bool multi) {
  Placement p;
  int start = int(rng.below(4));
  if (start == 1) p = Placement::group(kGroups[rng.below(kGroups.size())]);
  if (start == 2) p = Placement::groups({rng.pick(kGroups), rng.pick(kGroups)});
  if (start == 3) p = Placement::prefer(rng.chance(80) ? rng.pick(kGroups) : "absent");
  if (rng.chance(30)) p = p.thenPrefer(rng.pick(kGroups));
  if (rng.chance(15)) p = p.notGroup(rng.pick(kGroups));
  const std::vector<double> cpus{0, 0.5, 1, 1, 1, 2, 3.25, 8, 40};
  p = p.cpus(rng.pick(cpus));
  if (rng.chance(25)) p = p.gpus(rng.chance(70) ? 1 : 2);
  if (rng.chance(20)) p = p.memory(rng.below(20) * kGiB);
  if (rng.chance(10)) p = p.resource("fpga", double(1 + rng.below(2)));
  if (rng.chance(50)) p = p.pack();
  if (rng.chance(30)) {
    const std::vector<std::string> selectors{"zone=a",
                                             "zone!=b",
                                             "zone in (a, c)",
                                             "zone notin (a)",
                                             "zone",
                                             "!zone",
                                             "instance_type in (ml.c5.9xlarge, ml.p3.2xlarge)",
                                             "group=dnn_group",
                                             "group!=g2,zone"};
    p = p.labels(rng.pick(selectors));
  }
  if (multi) {
    int count = int(rng.below(3));
    if (count == 0) p = p.perNode(1);
    if (count == 1) p = p.perNode(uint32_t(1 + rng.below(4)));
    if (count == 2) p = p.perVcpu();
  }
  return p;
}

bool passesHard(const Node& n, const Placement& p) {
  return n.state == NodeState::ALIVE && p.allowsGroup(n.group) && p.getSelector().matches(n.labels);
}

/// The definition of place(), as a scan of every node (no expected hosts in play).
std::optional<NodeId> oracle(const ClusterView& view, const Placement& p) {
  for (const auto& g : p.getGroups()) {
    if (!view.hasGroup(g)) return std::nullopt;  // a typo in a hard group is an error
  }
  const Resources& need = p.getResources();
  bool byGpu = need.milliGpus > 0;
  auto best = [&](auto inTier) -> std::optional<NodeId> {
    std::optional<NodeId> bestId;
    int64_t bestFree = 0;
    for (const Node* n : view.getNodes()) {
      if (!passesHard(*n, p) || !inTier(*n) || !need.fitsIn(n->free())) continue;
      int64_t free = byGpu ? n->free().milliGpus : n->free().milliCpus;
      bool spread = p.getStrategy() == Placement::Strategy::SPREAD;
      if (!bestId || (spread ? free > bestFree : free < bestFree)) {  // nodes come in id order
        bestId = n->id;
        bestFree = free;
      }
    }
    return bestId;
  };
  for (const auto& g : p.getPreferred()) {
    if (auto id = best([&](const Node& n) { return n.group == g; })) return id;
  }
  return best([](const Node&) { return true; });
}

void checkBooks(const ClusterView& view) {
  for (const Node* n : view.getNodes()) REQUIRE(n->reserved.fitsIn(n->capacity));
}

}  // namespace

TEST_CASE("place agrees with a brute-force scan and keeps hard constraints", "[property]") {
  Rng rng(20240611);
  int placed = 0, unschedulable = 0;
  for (int c = 0; c < 1000; ++c) {
    ClusterView view = randomCluster(rng, false);
    for (int r = 0; r < 10; ++r) {
      Placement p = randomPlacement(rng, false);
      INFO(p.toText());
      Decision d = place(view, p);
      REQUIRE_FALSE(std::holds_alternative<Wait>(d));
      auto expected = oracle(view, p);
      if (auto* got = std::get_if<Placed>(&d)) {
        ++placed;
        const Node* n = view.findNode(got->nodeId);
        REQUIRE(n);
        REQUIRE(passesHard(*n, p));
        REQUIRE(p.getResources().fitsIn(n->free()));
        REQUIRE(expected == got->nodeId);
      } else {
        ++unschedulable;
        INFO(reasonOf(d));
        REQUIRE_FALSE(expected);
        REQUIRE_FALSE(std::get<Unschedulable>(d).reason.empty());
      }
      // Same input, same answer: also on a copy, and after a trip through text.
      REQUIRE(place(view, p) == d);
      REQUIRE(place(ClusterView(view), Placement::fromText(p.toText())) == d);
    }
  }
  CHECK(placed > 3000);
  CHECK(unschedulable > 1000);
}

TEST_CASE("place + reserve never oversubscribes and releases balance to zero", "[property]") {
  Rng rng(7);
  for (int c = 0; c < 300; ++c) {
    ClusterView view = randomCluster(rng, false);
    std::vector<std::pair<NodeId, Resources>> books;
    // Settle the random pre-reservations first so the end state must be exactly zero.
    for (const Node* n : view.getNodes()) {
      if (!n->reserved.isZero()) books.emplace_back(n->id, n->reserved);
    }
    for (int step = 0; step < 60; ++step) {
      if (!books.empty() && rng.chance(35)) {
        size_t i = rng.below(books.size());
        view.release(books[i].first, books[i].second);
        books.erase(books.begin() + i);
      } else {
        Placement p = randomPlacement(rng, false);
        Decision d = place(view, p);
        if (auto* got = std::get_if<Placed>(&d)) {
          NodeId id = got->nodeId;
          REQUIRE(view.reserve(id, p.getResources()));
          books.emplace_back(id, p.getResources());
        }
      }
      checkBooks(view);
    }
    for (auto& [id, r] : books) view.release(id, r);
    for (const Node* n : view.getNodes()) REQUIRE(n->reserved.isZero());
  }
}

TEST_CASE("gang equals placing and reserving one by one, or nothing", "[property]") {
  Rng rng(99);
  int whole = 0, none = 0;
  for (int c = 0; c < 2000; ++c) {
    ClusterView view = randomCluster(rng, false);
    std::vector<Placement> members;
    for (size_t i = 0, n = 1 + rng.below(5); i < n; ++i)
      members.push_back(randomPlacement(rng, false));
    ManyDecision d = gang(view, members);
    REQUIRE(gang(view, members) == d);

    ClusterView sequential = view;
    std::vector<NodeId> ids;
    bool complete = true;
    for (const auto& p : members) {
      Decision one = place(sequential, p);
      if (!std::holds_alternative<Placed>(one)) {
        complete = false;
        break;
      }
      REQUIRE(sequential.reserve(std::get<Placed>(one).nodeId, p.getResources()));
      ids.push_back(std::get<Placed>(one).nodeId);
    }
    if (auto* got = std::get_if<PlacedMany>(&d)) {
      ++whole;
      REQUIRE(complete);
      REQUIRE(got->nodeIds == ids);
      checkBooks(sequential);
    } else {
      ++none;
      REQUIRE_FALSE(complete);
    }
  }
  CHECK(whole > 100);
  CHECK(none > 100);
}

TEST_CASE("placeMany only uses eligible nodes and fits what it starts", "[property]") {
  Rng rng(31337);
  for (int c = 0; c < 2000; ++c) {
    ClusterView view = randomCluster(rng, false);
    Placement p = randomPlacement(rng, true);
    INFO(p.toText());
    ManyDecision d = placeMany(view, p);
    REQUIRE(placeMany(view, p) == d);
    REQUIRE_FALSE(std::holds_alternative<Wait>(d));
    auto* got = std::get_if<PlacedMany>(&d);
    if (!got) continue;
    REQUIRE_FALSE(got->nodeIds.empty());
    REQUIRE(std::is_sorted(got->nodeIds.begin(), got->nodeIds.end()));
    ClusterView after = view;
    for (NodeId id : got->nodeIds) {
      REQUIRE(passesHard(*view.findNode(id), p));
      REQUIRE(after.reserve(id, p.getResources()));
      if (p.getCount() == Placement::Count::PER_NODE) {
        REQUIRE(size_t(std::count(got->nodeIds.begin(), got->nodeIds.end(), id)) <= p.getPerNode());
      }
    }
    // Per node, it took as many as fit (up to the per-node cap): one more would not fit.
    for (NodeId id : got->nodeIds) {
      size_t n = std::count(got->nodeIds.begin(), got->nodeIds.end(), id);
      bool capped = p.getCount() == Placement::Count::PER_NODE && n == p.getPerNode();
      bool vcpuCapped = p.getCount() == Placement::Count::PER_VCPU &&
                        n == size_t(view.findNode(id)->free().milliCpus / 1000);
      if (!capped && !vcpuCapped)
        REQUIRE_FALSE(p.getResources().fitsIn(after.findNode(id)->free()));
    }
  }
}

TEST_CASE("wait only while a matching host is still to join", "[property]") {
  Rng rng(4242);
  int waits = 0;
  for (int c = 0; c < 3000; ++c) {
    ClusterView view = randomCluster(rng, true);
    Placement p = randomPlacement(rng, false);
    Decision d = place(view, p);
    if (!std::holds_alternative<Wait>(d)) continue;
    ++waits;
    const auto& hosts = std::get<Wait>(d).hosts;
    REQUIRE_FALSE(hosts.empty());
    // Without the expected hosts and the JOINING nodes, the answer is final.
    ClusterView settled = view;
    settled.forgetAllExpected();
    for (const Node* n : view.getNodes()) {
      if (n->state == NodeState::JOINING) settled.setState(n->id, NodeState::LOST);
    }
    REQUIRE_FALSE(std::holds_alternative<Wait>(place(settled, p)));
  }
  CHECK(waits > 20);
}

TEST_CASE("every placement survives toText and parse", "[property][text]") {
  Rng rng(1);
  for (int i = 0; i < 5000; ++i) {
    Placement p = randomPlacement(rng, rng.chance(50));
    std::string text = p.toText();
    INFO(text);
    auto parsed = Placement::parse(text);
    REQUIRE(parsed);
    REQUIRE(*parsed == p);
    REQUIRE(parsed->toText() == text);
    REQUIRE_FALSE(p.describe().empty());
  }
}
