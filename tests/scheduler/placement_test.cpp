// Placement: the builder, its text form, and place() for every constraint and strategy, with the
// exact messages a person sees.

#include <catch2/catch.hpp>

#include "test_util.h"

using namespace troupe::sched;
using namespace troupe::sched::test;

TEST_CASE("placement builder defaults and accessors", "[placement]") {
  Placement p;
  CHECK(p == Placement::any());
  CHECK(p.getResources() == Resources::of(1));
  CHECK(p.getStrategy() == Placement::Strategy::SPREAD);
  CHECK_FALSE(p.isMultiInstance());

  auto q =
      Placement::groups({"dnn_group", "a", "a"}).notGroup("b").gpus(1).cpus(0.5).memory(2 * kGiB);
  CHECK(q.getGroups() == std::vector<std::string>{"a", "dnn_group"});
  CHECK(q.getExcludedGroups() == std::vector<std::string>{"b"});
  CHECK(q.getResources() == Resources::of(0.5, 1, 2 * kGiB));

  auto r = Placement::prefer("data_group").thenPrefer("x").thenPrefer("data_group");
  CHECK(r.getPreferred() == std::vector<std::string>{"data_group", "x"});
  CHECK(Placement::onePerNode() == Placement::any().perNode(1));
  CHECK(Placement::any().perVcpu().isMultiInstance());

  CHECK_THROWS_WITH(Placement::any().labels("group=,x"),
                    "selector 'group=,x': expected a value at column 7");
  CHECK_THROWS_AS(Placement::any().perNode(0), std::invalid_argument);
  CHECK_THROWS_AS(Placement::any().cpus(-1), std::invalid_argument);
  CHECK_THROWS_AS(Placement::group("bad name"), std::invalid_argument);
}

TEST_CASE("a starting point inside a chain refines it or does not compile", "[placement]") {
  // On a plain class, these would call the statics and drop everything before them. That group()
  // and any() in a chain do not compile is tested in tests/compile_fail.
  auto p = Placement::group("cpu_pool").cpus(2).onePerNode();
  CHECK(p.getGroups() == std::vector<std::string>{"cpu_pool"});
  CHECK(p.getResources() == Resources::of(2));
  CHECK(p.getCount() == Placement::Count::PER_NODE);
  CHECK(p.getPerNode() == 1);
  CHECK(p == Placement::group("cpu_pool").cpus(2).perNode(1));

  auto q = Placement::group("dnn_group").prefer("a").prefer("b");
  CHECK(q.getGroups() == std::vector<std::string>{"dnn_group"});
  CHECK(q.getPreferred() == std::vector<std::string>{"a", "b"});

  Placement stored = Placement::prefer("a").gpus(1);  // a Chain is a Placement
  CHECK(stored == Placement::any().thenPrefer("a").gpus(1));
}

TEST_CASE("placement text reads like the builder", "[placement][text]") {
  struct Row {
    Placement placement;
    const char* text;
  };
  const Row rows[] = {
      {Placement::any(), "any()"},
      {Placement::group("dnn_group").gpus(1), "group(dnn_group).gpus(1)"},
      {Placement::prefer("data_group").perVcpu(), "prefer(data_group).perVcpu()"},
      {Placement::onePerNode(), "onePerNode()"},
      {Placement::group("a").perNode(1), "group(a).perNode(1)"},
      {Placement::groups({"b", "a"}).thenPrefer("b").notGroup("c").cpus(0.25).memory(1024).pack(),
       "groups(a, b).thenPrefer(b).notGroup(c).cpus(0.25).memory(1024).pack()"},
      {Placement::any().resource("fpga", 2).labels("zone in (b, a),!spot").perNode(3),
       "any().resource(fpga, 2).labels(\"zone in (a, b),!spot\").perNode(3)"},
      {Placement::prefer("x").thenPrefer("y").cpus(0), "prefer(x).thenPrefer(y).cpus(0)"},
  };
  for (const auto& row : rows) {
    INFO(row.text);
    CHECK(row.placement.toText() == row.text);
    auto parsed = Placement::parse(row.text);
    REQUIRE(parsed);
    CHECK(*parsed == row.placement);
  }
  // The parser is lenient about spaces and accepts any order of calls.
  CHECK(Placement::fromText(" gpus( 1 ) . group( dnn_group )") ==
        Placement::group("dnn_group").gpus(1));
}

TEST_CASE("placement parse errors name the call and column", "[placement][text]") {
  struct Row {
    const char* text;
    const char* error;
  };
  const Row rows[] = {
      {"group(dnn_group).gpu(1)",
       "placement 'group(dnn_group).gpu(1)': unknown call 'gpu' (calls are: any, group, groups, "
       "prefer, thenPrefer, notGroup, cpus, gpus, memory, resource, spread, pack, labels, perNode, "
       "onePerNode, perVcpu) at column 18"},
      {"", "placement '': expected a call like group(dnn_group) at column 1"},
      {"group()", "placement 'group()': 'group' needs an argument at column 7"},
      {"group(a", "placement 'group(a': expected ')' at column 8"},
      {"cpus(1.2345)", "placement 'cpus(1.2345)': amounts have at most 3 decimals at column 11"},
      {"cpus(x)", "placement 'cpus(x)': expected an amount like 1 or 0.5 at column 6"},
      {"perNode(0)", "placement 'perNode(0)': perNode needs at least 1 at column 9"},
      {"labels(\"a=\")",
       "placement 'labels(\"a=\")': bad labels (selector 'a=': expected a value at column 3) at "
       "column 9"},
      {"any() pack()", "placement 'any() pack()': expected '.' or the end at column 7"},
  };
  for (const auto& row : rows) {
    INFO(row.text);
    auto parsed = Placement::parse(row.text);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error == row.error);
  }
  CHECK_THROWS_AS(Placement::fromText("nope()"), std::invalid_argument);
}

TEST_CASE("describe is for logs", "[placement]") {
  CHECK(Placement::group("dnn_group").gpus(1).describe() ==
        "1 actor in group 'dnn_group', each 1 cpu, 1 gpu, spread");
  CHECK(Placement::prefer("data_group").perVcpu().describe() ==
        "as many actors as fit per node in any group, preferring 'data_group' in that order, each "
        "1 cpu, spread");
}

TEST_CASE("place honours hard group constraints", "[place]") {
  ClusterView view = heteroCluster();
  CHECK(placedOn(place(view, Placement::group("dnn_group"))) == 3);
  CHECK(placedOn(place(view, Placement::group("data_group"))) == 1);
  CHECK(placedOn(place(view, Placement::any().notGroup("data_group"))) == 3);
  CHECK(placedOn(place(view, Placement::any().labels("host=algo-2"))) == 2);
  CHECK(placedOn(place(view, Placement::any().labels("group notin (dnn_group), host!=algo-1"))) ==
        2);
  CHECK(placedOn(place(view, Placement::any().gpus(1))) == 3);  // only algo-3 has a gpu
}

TEST_CASE("unknown groups list the known ones", "[place][errors]") {
  ClusterView view = heteroCluster();
  auto d = place(view, Placement::group("dnn_grup"));
  REQUIRE(std::holds_alternative<Unschedulable>(d));
  CHECK(reasonOf(d) == "group 'dnn_grup' is unknown; groups are: data_group, dnn_group");
  // A preferred group the cluster lacks is no error: that is how a homogeneous cluster runs.
  CHECK(placedOn(place(view, Placement::prefer("nowhere"))) == 3);
}

TEST_CASE("unschedulable names the constraint, the candidates and their free capacity",
          "[place][errors]") {
  ClusterView view = heteroCluster();
  REQUIRE(view.reserve(3, Resources::of(1, 1)));
  auto d = place(view, Placement::group("dnn_group").gpus(1));
  REQUIRE(std::holds_alternative<Unschedulable>(d));
  CHECK(reasonOf(d) ==
        "no node in group 'dnn_group' has 1 free gpu: algo-3 has 0 of 1 free; algo-3 has that "
        "much in total, so it fits once actors there stop");
  CHECK(std::get<Unschedulable>(d).fitsWhenFree);

  auto big = place(view, Placement::group("data_group").cpus(6).memory(12 * kGiB));
  CHECK(reasonOf(big) ==
        "no node in group 'data_group' has 6 free cpus and 12 GiB free memory: algo-1 has 4 of 4 "
        "cpus free and 8 GiB of 8 GiB memory free, algo-2 has 4 of 4 cpus free and 8 GiB of 8 GiB "
        "memory free");
  CHECK_FALSE(std::get<Unschedulable>(big).fitsWhenFree);

  CHECK(reasonOf(place(view, Placement::any().resource("fpga", 1))) ==
        "no node has 1 free fpga: algo-1 has 0 of 0 free, algo-2 has 0 of 0 free, algo-3 has 0 of "
        "0 free");
  CHECK(reasonOf(place(view, Placement::group("data_group").labels("zone=a"))) ==
        "no node in group 'data_group' matches labels 'zone=a' (2 nodes checked, e.g. algo-1 has "
        "instance_type=ml.c5.xlarge)");
  CHECK(reasonOf(place(view, Placement::group("dnn_group").notGroup("dnn_group"))) ==
        "no node is in group 'dnn_group' outside 'dnn_group'; groups are: data_group, dnn_group");

  view.setState(3, NodeState::LOST);
  CHECK(reasonOf(place(view, Placement::group("dnn_group"))) ==
        "no ALIVE node in group 'dnn_group': algo-3 is LOST");
}

TEST_CASE("long candidate lists are cut", "[place][errors]") {
  ClusterView view;
  for (NodeId id = 1; id <= 8; ++id) {
    addNode(view, id, "algo-" + std::to_string(id), "data_group", "ml.c5.xlarge");
  }
  auto reason = reasonOf(place(view, Placement::any().cpus(5)));
  CHECK(reason ==
        "no node has 5 free cpus: algo-1 has 4 of 4 free, algo-2 has 4 of 4 free, algo-3 has 4 of "
        "4 free, algo-4 has 4 of 4 free, algo-5 has 4 of 4 free and 3 more");
}

TEST_CASE("prefer falls back to anything that fits", "[place][prefer]") {
  ClusterView view = heteroCluster();
  auto p = Placement::prefer("data_group").cpus(4);
  CHECK(placedOn(place(view, p)) == 1);
  REQUIRE(view.reserve(1, Resources::of(4)));
  CHECK(placedOn(place(view, p)) == 2);
  REQUIRE(view.reserve(2, Resources::of(4)));
  CHECK(placedOn(place(view, p)) == 3);  // data_group is full: fall back to dnn_group
  CHECK(placedOn(place(view, Placement::prefer("x").thenPrefer("dnn_group"))) == 3);
  // Preferences never break hard constraints.
  CHECK(std::holds_alternative<Unschedulable>(
      place(view, Placement::prefer("dnn_group").cpus(4).notGroup("dnn_group"))));
}

TEST_CASE("spread takes the least loaded, pack the most loaded that fits", "[place][strategy]") {
  ClusterView view;
  addNode(view, 1, "a", "g", "ml.c5.2xlarge");  // 8 vCPU
  addNode(view, 2, "b", "g", "ml.c5.2xlarge");
  addNode(view, 3, "c", "g", "ml.c5.2xlarge");
  REQUIRE(view.reserve(1, Resources::of(2)));  // a: 6 free
  REQUIRE(view.reserve(3, Resources::of(7)));  // c: 1 free
  struct Row {
    Placement placement;
    NodeId expected;
  };
  const Row rows[] = {
      {Placement::any(), 2},                 // most free
      {Placement::any().pack(), 3},          // least free that fits
      {Placement::any().pack().cpus(2), 1},  // c has 1: a is the fullest that fits
      {Placement::any().cpus(7), 2},
      {Placement::any().pack().cpus(7), 2},
  };
  for (const auto& row : rows) {
    INFO(row.placement.toText());
    CHECK(placedOn(place(view, row.placement)) == row.expected);
  }
  // Ties go to the lowest id.
  ClusterView even;
  addNode(even, 9, "x", "g", "ml.c5.xlarge");
  addNode(even, 4, "y", "g", "ml.c5.xlarge");
  addNode(even, 7, "z", "h", "ml.c5.xlarge");
  CHECK(placedOn(place(even, Placement::any())) == 4);
  CHECK(placedOn(place(even, Placement::any().pack())) == 4);
}

TEST_CASE("gpu requests rank nodes by free gpus", "[place][strategy]") {
  ClusterView view;
  addNode(view, 1, "p3-8", "dnn_group", "ml.p3.8xlarge");  // 4 gpus
  addNode(view, 2, "p3-2", "dnn_group", "ml.p3.2xlarge");  // 1 gpu
  CHECK(placedOn(place(view, Placement::any().gpus(1))) == 1);
  CHECK(placedOn(place(view, Placement::any().gpus(1).pack())) == 2);
  CHECK(placedOn(place(view, Placement::any().gpus(2).pack())) == 1);
}

TEST_CASE("wait while expected hosts that might fit have not joined", "[place][wait]") {
  ClusterView view;
  view.expectHost({"algo-1", "data_group", "ml.c5.xlarge"});
  view.expectHost({"algo-2", "dnn_group", "ml.p3.2xlarge"});
  addNode(view, 1, "algo-1", "data_group", "ml.c5.xlarge");
  CHECK(view.getExpectedHosts().size() == 1);

  auto d = place(view, Placement::group("dnn_group").gpus(1));
  REQUIRE(std::holds_alternative<Wait>(d));
  CHECK(std::get<Wait>(d).hosts == std::vector<std::string>{"algo-2"});
  CHECK(reasonOf(d) ==
        "no ALIVE node in group 'dnn_group' has 1 cpu, 1 gpu free yet; waiting for 1 host to "
        "join: algo-2 (dnn_group, ml.p3.2xlarge)");
  // Requests the expected host could not take either fail at once.
  CHECK(std::holds_alternative<Unschedulable>(place(view, Placement::any().gpus(2))));
  // A preferred group still joining is waited for rather than fallen back from.
  CHECK(std::holds_alternative<Wait>(place(view, Placement::prefer("dnn_group"))));
  // After the join deadline the runtime forgets the host, and the answer is final.
  view.forgetExpected("algo-2");
  CHECK(placedOn(place(view, Placement::prefer("dnn_group"))) == 1);
  auto later = place(view, Placement::group("dnn_group").gpus(1));
  CHECK(reasonOf(later) == "group 'dnn_group' is unknown; groups are: data_group");

  // A JOINING node is waited for too, and an ALIVE one ends the wait.
  NodeSpec spec{2, "algo-2", "dnn_group", "ml.p3.2xlarge", {}, std::nullopt};
  view.addNode(spec, NodeState::JOINING);
  CHECK(std::holds_alternative<Wait>(place(view, Placement::group("dnn_group").gpus(1))));
  view.setState(2, NodeState::ALIVE);
  CHECK(placedOn(place(view, Placement::group("dnn_group").gpus(1))) == 2);
}

TEST_CASE("placeMany: one per node, per node, per vCPU", "[placeMany]") {
  ClusterView view = heteroCluster();
  using V = std::vector<NodeId>;
  auto ids = [&](const Placement& p) {
    auto d = placeMany(view, p);
    INFO(reasonOf(d));
    REQUIRE(std::holds_alternative<PlacedMany>(d));
    return std::get<PlacedMany>(d).nodeIds;
  };
  CHECK(ids(Placement::onePerNode()) == V{1, 2, 3});
  CHECK(ids(Placement::group("data_group").perNode(2)) == V{1, 1, 2, 2});
  CHECK(ids(Placement::group("data_group").perNode(3).cpus(2)) == V{1, 1, 2, 2});
  CHECK(ids(Placement::prefer("data_group").perVcpu()) == V{1, 1, 1, 1, 2, 2, 2, 2});
  CHECK(ids(Placement::group("dnn_group").perVcpu().cpus(3)) == V{3, 3});
  CHECK(ids(Placement::group("dnn_group").gpus(1)) == V{3});  // single-instance: a list of one

  // Homogeneous: the preferred group is absent, so fill whatever there is.
  ClusterView homo;
  addNode(homo, 5, "algo-1", "homogeneous", "ml.c5.xlarge");
  CHECK(std::get<PlacedMany>(placeMany(homo, Placement::prefer("data_group").perVcpu())).nodeIds ==
        V{5, 5, 5, 5});

  // A full preferred group falls back; a node without room is skipped.
  REQUIRE(view.reserve(1, Resources::of(4)));
  REQUIRE(view.reserve(2, Resources::of(4)));
  CHECK(ids(Placement::prefer("data_group").perVcpu()) == V{3, 3, 3, 3, 3, 3, 3, 3});
  CHECK(ids(Placement::onePerNode()) == V{3});
  auto none = placeMany(view, Placement::group("data_group").perNode(1));
  CHECK(reasonOf(none) ==
        "no node in group 'data_group' has 1 free cpu: algo-1 has 0 of 4 free, algo-2 has 0 of 4 "
        "free; algo-1 has that much in total, so it fits once actors there stop");
}

TEST_CASE("placeMany waits for every eligible expected host", "[placeMany][wait]") {
  ClusterView view = heteroCluster();
  view.expectHost({"algo-4", "data_group", "ml.c5.xlarge"});
  auto d = placeMany(view, Placement::onePerNode());
  REQUIRE(std::holds_alternative<Wait>(d));
  CHECK(std::get<Wait>(d).hosts == std::vector<std::string>{"algo-4"});
  // An expected host outside the placement's groups does not hold it up.
  CHECK(
      std::holds_alternative<PlacedMany>(placeMany(view, Placement::group("dnn_group").perVcpu())));
}

TEST_CASE("gang is all or nothing and accounts for earlier members", "[gang]") {
  ClusterView view = heteroCluster();
  std::vector<Placement> four(4, Placement::group("data_group").cpus(2));
  auto d = gang(view, four);
  REQUIRE(std::holds_alternative<PlacedMany>(d));
  CHECK(std::get<PlacedMany>(d).nodeIds == std::vector<NodeId>{1, 2, 1, 2});  // spread spreads

  std::vector<Placement> packed(2, Placement::group("data_group").cpus(2).pack());
  CHECK(std::get<PlacedMany>(gang(view, packed)).nodeIds == std::vector<NodeId>{1, 1});

  std::vector<Placement> five(5, Placement::group("data_group").cpus(2));
  auto no = gang(view, five);
  REQUIRE(std::holds_alternative<Unschedulable>(no));
  CHECK(reasonOf(no) ==
        "gang member 4 of 5 (group(data_group).cpus(2)): no node in group 'data_group' has 2 free "
        "cpus: algo-1 has 0 of 4 free, algo-2 has 0 of 4 free; algo-1 has that much in total, so "
        "it fits once actors there stop");

  std::vector<Placement> mixed{Placement::group("dnn_group").gpus(1),
                               Placement::prefer("dnn_group").gpus(1)};
  CHECK(std::holds_alternative<Unschedulable>(gang(view, mixed)));
  std::vector<Placement> multi{Placement::onePerNode()};
  CHECK_THROWS_AS(gang(view, multi), std::invalid_argument);
  CHECK(std::get<PlacedMany>(gang(view, std::span<const Placement>())).nodeIds.empty());
}
