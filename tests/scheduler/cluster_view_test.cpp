// ClusterView books and membership, the instance table and Resources arithmetic.

#include <catch2/catch.hpp>

#include "test_util.h"

using namespace troupe::sched;
using namespace troupe::sched::test;

TEST_CASE("instance table has the public figures", "[instances]") {
  struct Row {
    const char* name;
    uint32_t vcpus, gpus;
    double price;
  };
  const Row rows[] = {{"ml.p4d.24xlarge", 96, 8, 37.688},
                      {"ml.c5.18xlarge", 72, 0, 3.672},
                      {"ml.p3.2xlarge", 8, 1, 3.825},
                      {"ml.c5.9xlarge", 36, 0, 1.836}};
  for (const auto& row : rows) {
    INFO(row.name);
    auto t = findInstanceType(row.name);
    REQUIRE(t);
    CHECK(t->vcpus == row.vcpus);
    CHECK(t->gpus == row.gpus);
    CHECK(t->pricePerHour == Approx(row.price));
  }
  CHECK_FALSE(findInstanceType("ml.nope.xlarge"));
  CHECK(knownInstanceTypes().size() >= 16);
  for (const char* name :
       {"ml.c5.xlarge", "ml.c5.2xlarge", "ml.c5.4xlarge", "ml.m5.xlarge", "ml.m4.xlarge",
        "ml.p3.8xlarge", "ml.p3.16xlarge", "ml.g5.xlarge", "ml.g5.8xlarge", "ml.g5.16xlarge",
        "ml.g5.48xlarge", "ml.trn1.32xlarge"}) {
    CHECK(findInstanceType(name));
  }
  CHECK(findInstanceType("ml.c5.xlarge")->capacity() == Resources::of(4, 0, 8 * kGiB));
}

TEST_CASE("nodes carry labels and capacity", "[view]") {
  ClusterView view;
  const Node& n = addNode(view, 7, "algo-1", "data_group", "ml.c5.9xlarge", {{"zone", "a"}});
  CHECK(n.labels == Labels{{"group", "data_group"},
                           {"instance_type", "ml.c5.9xlarge"},
                           {"host", "algo-1"},
                           {"zone", "a"}});
  CHECK(n.capacity.cpus() == 36);
  CHECK(view.findHost("algo-1") == &n);
  CHECK(view.findNode(8) == nullptr);

  NodeSpec custom{8,          "bare-1", "data_group",
                  "homebrew", {},       Resources::of(2).withCustom("fpga", 1)};
  CHECK(view.addNode(custom).capacity.custom("fpga") == 1);
  NodeSpec unknown{9, "bare-2", "data_group", "homebrew", {}, std::nullopt};
  CHECK_THROWS_WITH(view.addNode(unknown),
                    "cannot add node 9 (bare-2): instance type 'homebrew' is not in the table; "
                    "give a capacity");
  NodeSpec dup{7, "algo-9", "data_group", "ml.c5.xlarge", {}, std::nullopt};
  CHECK_THROWS_AS(view.addNode(dup), std::invalid_argument);
  NodeSpec liar{10,          "algo-10", "data_group", "ml.c5.xlarge", {{"group", "dnn_group"}},
                std::nullopt};
  CHECK_THROWS_AS(view.addNode(liar), std::invalid_argument);
  CHECK(view.getGroupNames() == std::vector<std::string>{"data_group"});
  view.removeNode(8);
  CHECK(view.size() == 1);
}

TEST_CASE("reserve never oversubscribes and release balances", "[view][books]") {
  ClusterView view = heteroCluster();
  CHECK(view.reserve(1, Resources::of(3)));
  CHECK_FALSE(view.reserve(1, Resources::of(2)));  // 1 of 4 left
  CHECK(view.reserve(1, Resources::of(0.5)));
  CHECK(view.findNode(1)->free() == Resources::of(0.5, 0, 8 * kGiB));
  CHECK_THROWS_AS(view.release(1, Resources::of(4)), std::logic_error);
  CHECK_THROWS_AS(view.release(1, Resources::of(0, 1)), std::logic_error);
  CHECK_THROWS_AS(view.reserve(99, Resources::of(1)), std::invalid_argument);
  view.release(1, Resources::of(3));
  view.release(1, Resources::of(0.5));
  CHECK(view.findNode(1)->reserved.isZero());

  // Fractions sum exactly: ten reservations of 0.1 cpu fill a 1-cpu slice.
  ClusterView tiny;
  tiny.addNode({1, "t", "g", "x", {}, Resources::of(1)});
  for (int i = 0; i < 10; ++i) REQUIRE(tiny.reserve(1, Resources::of(0.1)));
  CHECK_FALSE(tiny.reserve(1, Resources::of(0.001)));
  for (int i = 0; i < 10; ++i) tiny.release(1, Resources::of(0.1));
  CHECK(tiny.findNode(1)->reserved.isZero());

  // A LOST node takes nothing new, but its books can still be settled.
  REQUIRE(view.reserve(3, Resources::of(1, 1)));
  view.setState(3, NodeState::LOST);
  CHECK_FALSE(view.reserve(3, Resources::of(1)));
  view.release(3, Resources::of(1, 1));
  CHECK(view.findNode(3)->reserved.isZero());

  REQUIRE(view.reserve(2, Resources::of(2)));
  CHECK_THROWS_AS(view.setCapacity(2, Resources::of(1)), std::logic_error);
  view.setCapacity(2, Resources::of(16, 0, 32 * kGiB));
  CHECK(placedOn(place(view, Placement::any().cpus(10))) == 2);
}

TEST_CASE("resources describe themselves", "[resources]") {
  CHECK(Resources::of(1).describe() == "1 cpu");
  CHECK(Resources::of(2.5, 1, 3 * kGiB / 2).withCustom("fpga", 2).describe() ==
        "2.5 cpus, 1 gpu, 1.5 GiB memory, fpga=2");
  CHECK(formatMilli(-1500) == "-1.5");
  CHECK(formatBytes(1000) == "1000 B");
  CHECK(Resources::of(1).countFitting(Resources::of(4.5), 100) == 4);
  CHECK(Resources().countFitting(Resources::of(4.5), 3) == 3);
}

TEST_CASE("copies are independent", "[view]") {
  ClusterView a = heteroCluster();
  ClusterView b = a;
  REQUIRE(b.reserve(3, Resources::of(1, 1)));
  CHECK(placedOn(place(a, Placement::any().gpus(1))) == 3);
  CHECK(std::holds_alternative<Unschedulable>(place(b, Placement::any().gpus(1))));
  ClusterView c = std::move(b);
  CHECK(c.findNode(3)->reserved == Resources::of(1, 1));
}
