// File: troupe/sched/placement.h
//
// Placement: where an actor (or a set of actors) may run and what each one needs. This is what
// apps write, so it is a value-type builder that reads like a sentence:
//
//   Placement::group("dnn_group").gpus(1)
//   Placement::prefer("data_group").perVcpu()
//   Placement::any().memory(4ull << 30).labels("instance_type in (ml.c5.9xlarge, ml.c5.18xlarge)")
//   Placement::onePerNode()
//
// Every builder call returns a modified copy ([[nodiscard]] catches a dropped result), so a
// Placement can be stored, compared and reused freely. The copy is a Placement::Chain, on which a
// starting point cannot silently restart the chain (see the class below). A Placement travels
// over the wire as text: `Placement::parse(p.toText()) == p` for every placement. The text is the
// builder chain itself, e.g. `group(dnn_group).gpus(1)`; see docs/scheduler.md for the grammar.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/sched/resources.h"
#include "troupe/sched/selector.h"

namespace troupe::sched {

namespace detail {
struct PlacementText;
}

class Placement {
 public:
  /// Which of the nodes that fit comes first. SPREAD (the default): the node with the most free
  /// capacity of the request's dominant resource (gpu when the request asks for gpus, cpu
  /// otherwise). PACK: the node with the least free capacity that still fits. Ties go to the
  /// lowest node id, so decisions are deterministic.
  enum class Strategy : uint8_t { SPREAD, PACK };

  /// How many actors the placement starts. ONE: one actor (place()). PER_NODE: up to
  /// `getPerNode()` actors on every eligible node, as capacity allows. PER_VCPU: as many as fit on
  /// every eligible node — with the default cpus(1), one per free vCPU ("fill a group").
  enum class Count : uint8_t { ONE, PER_NODE, PER_VCPU };

  using ParseResult = Parsed<Placement>;

  /// What the starting points and the refinements return: a Placement whose chain cannot start
  /// again by mistake (below the class).
  class Chain;

  /// Same as any(): one actor, anywhere, 1 cpu.
  Placement();

  // ---------------------------------------------------------------------------------------------
  // Starting points

  /// Any node that fits.
  static Chain any();
  /// Only nodes of instance group `name` (a hard constraint). An unknown group is an error
  /// listing the known groups.
  static Chain group(std::string_view name);
  /// Only nodes of one of `names` (a hard constraint).
  static Chain groups(const std::vector<std::string>& names);
  /// Soft preference: nodes of `name` first; when none fits, any node that fits. A preferred
  /// group the cluster does not have is skipped, so the same app runs on a homogeneous cluster.
  static Chain prefer(std::string_view name);
  /// One actor on every eligible node; same as any().perNode(1).
  static Chain onePerNode();

  // ---------------------------------------------------------------------------------------------
  // Refinements. Each returns a modified copy.

  /// Excludes a group (a hard constraint). Unknown names are accepted: excluding a group the
  /// cluster lacks is not an error.
  [[nodiscard]] Chain notGroup(std::string_view name) const;
  /// Adds a further soft preference, tried after the earlier ones. (Named `thenPrefer` because a
  /// C++ class cannot have a static and a member function of the same signature.)
  [[nodiscard]] Chain thenPrefer(std::string_view name) const;

  /// Cpus each actor needs (default 1; fractional amounts are kept to a thousandth).
  [[nodiscard]] Chain cpus(double n) const;
  /// Gpus each actor needs (default 0).
  [[nodiscard]] Chain gpus(double n) const;
  /// Memory each actor needs, in bytes (default 0).
  [[nodiscard]] Chain memory(uint64_t bytes) const;
  /// A custom resource each actor needs; 0 removes it.
  [[nodiscard]] Chain resource(std::string_view name, double n) const;

  [[nodiscard]] Chain spread() const;
  [[nodiscard]] Chain pack() const;

  /// Adds hard label constraints in selector syntax (see selector.h), e.g.
  /// "group=data_group,instance_type in (ml.c5.9xlarge, ml.c5.18xlarge)". Throws
  /// std::invalid_argument with the parse error (a bug in the app's source, not a runtime
  /// condition); use LabelSelector::parse() to validate untrusted text.
  [[nodiscard]] Chain labels(std::string_view selector) const;
  [[nodiscard]] Chain labels(const LabelSelector& selector) const;

  /// Up to `n` actors on every eligible node (n >= 1; perNode(1) is one per node).
  [[nodiscard]] Chain perNode(uint32_t n) const;
  /// As many actors as fit on every eligible node: one per free vCPU with the default cpus(1).
  [[nodiscard]] Chain perVcpu() const;

  // ---------------------------------------------------------------------------------------------
  // Reading it back

  /// Allowed groups, sorted; empty means any group.
  const std::vector<std::string>& getGroups() const { return groups_; }
  /// Excluded groups, sorted.
  const std::vector<std::string>& getExcludedGroups() const { return excluded_; }
  /// Preferred groups in the order they are tried.
  const std::vector<std::string>& getPreferred() const { return preferred_; }
  /// What one actor needs; reserve exactly this on the chosen node.
  const Resources& getResources() const { return resources_; }
  Strategy getStrategy() const { return strategy_; }
  const LabelSelector& getSelector() const { return selector_; }
  Count getCount() const { return count_; }
  /// The n of perNode(n); 1 otherwise.
  uint32_t getPerNode() const { return perNode_; }
  /// True for onePerNode / perNode / perVcpu (use placeMany()).
  bool isMultiInstance() const { return count_ != Count::ONE; }

  /// True when `group` passes the hard group constraints (groups / notGroup).
  bool allowsGroup(std::string_view group) const;

  // ---------------------------------------------------------------------------------------------
  // Text

  /// Canonical text, e.g. "prefer(data_group).perVcpu()"; parse() reads it back exactly.
  std::string toText() const;
  /// Parses placement text. Errors name the text and the column:
  /// "placement 'group(dnn_group).gpu(1)': unknown call 'gpu' at column 18; ...".
  static ParseResult parse(std::string_view text);
  /// Like parse() but throws std::invalid_argument with the error.
  static Placement fromText(std::string_view text);

  /// For logs: "1 actor in group 'dnn_group', each 1 cpu, 1 gpu, spread".
  std::string describe() const;

  // A friend, so that comparing a Chain with a Placement is not ambiguous with its C++20 reverse.
  friend bool operator==(const Placement&, const Placement&) = default;

 private:
  friend struct detail::PlacementText;  // the parser sets fields the builder only starts with

  std::vector<std::string> groups_;
  std::vector<std::string> excluded_;
  std::vector<std::string> preferred_;
  Resources resources_;
  LabelSelector selector_;
  Strategy strategy_ = Strategy::SPREAD;
  Count count_ = Count::ONE;
  uint32_t perNode_ = 1;
};

namespace detail {
template <typename>
inline constexpr bool kChainRestarts = false;
}

class Placement::Chain : public Placement {
  // C++ lets a static member function be called through an object, so on a plain Placement
  // `Placement::group("cpu_pool").cpus(2).onePerNode()` would compile and return a brand-new
  // placement, silently dropping the group and the cpus. Every builder call returns a Chain
  // instead, on which the starting points mean what the chain says or do not compile:
  //   - onePerNode() and prefer() refine, as perNode(1) and thenPrefer();
  //   - any(), group() and groups() are compile errors naming what to write instead.
  // A Chain is a Placement (no field of its own): store it, pass it and compare it as one.
 public:
  /// Up to one actor on every eligible node of this placement; same as perNode(1).
  [[nodiscard]] Chain onePerNode() const { return perNode(1); }
  /// A further soft preference; same as thenPrefer(name).
  [[nodiscard]] Chain prefer(std::string_view name) const { return thenPrefer(name); }

  template <typename Never = void>
  Chain any() const {
    static_assert(detail::kChainRestarts<Never>,
                  "Placement::any() starts a placement: inside a chain it would drop every call "
                  "before it. Start the chain with it, or leave it out.");
    return *this;
  }
  template <typename Never = void>
  Chain group(std::string_view) const {
    static_assert(detail::kChainRestarts<Never>,
                  "Placement::group() starts a placement: inside a chain it would drop every call "
                  "before it. Start with it (Placement::group(\"g\").cpus(2)), or narrow a chain "
                  "with notGroup() or labels(\"group=g\").");
    return *this;
  }
  template <typename Never = void>
  Chain groups(const std::vector<std::string>&) const {
    static_assert(detail::kChainRestarts<Never>,
                  "Placement::groups() starts a placement: inside a chain it would drop every call "
                  "before it. Start with it, or narrow a chain with notGroup() or labels().");
    return *this;
  }

 private:
  friend class Placement;
  Chain(Placement placement) : Placement(std::move(placement)) {}  // NOLINT: the builders' return
};

}  // namespace troupe::sched
