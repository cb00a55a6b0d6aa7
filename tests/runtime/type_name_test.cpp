// Typed registration (troupe/type_name.h, Registry::add<A>()): the name comes from the schema.

#include "troupe/type_name.h"

#include <catch2/catch.hpp>

#include "troupe/driver.h"
#include "troupe/registry.h"
#include "type_name_test.capnp.h"

namespace {

class CounterActor final : public troupe::ActorBase<troupe::test::Counter> {
 public:
  using ActorBase::ActorBase;
};

class OtherCounterActor final : public troupe::ActorBase<troupe::test::Counter> {
 public:
  using ActorBase::ActorBase;
};

class InnerActor final : public troupe::ActorBase<troupe::test::Outer::Inner> {
 public:
  using ActorBase::ActorBase;
};

}  // namespace

TEST_CASE("type name: the schema file's name without .capnp, a dot, the interface's name") {
  CHECK(troupe::actorTypeName<troupe::test::Counter>() == "type_name_test.Counter");
  CHECK(troupe::actorTypeName<troupe::test::Outer::Inner>() == "type_name_test.Outer.Inner");
  // troupe's own schema, compiled the same way.
  CHECK(troupe::actorTypeName<troupe::proto::Actor>() == "troupe.Actor");
}

TEST_CASE("type name: GangMember::of<T>() names the member by its interface") {
  auto member = troupe::GangMember::of<troupe::test::Counter>(troupe::Placement::any());
  CHECK(member.typeName == "type_name_test.Counter");
}

TEST_CASE("type name: registry add<A>() registers under A's interface name") {
  troupe::Registry types;
  types.add<CounterActor>().add<InnerActor>();
  CHECK(types.has("type_name_test.Counter"));
  CHECK(types.has("type_name_test.Outer.Inner"));
  CHECK(types.names() == "type_name_test.Counter, type_name_test.Outer.Inner");
}

TEST_CASE("type name: a second class for one interface needs the string form") {
  troupe::Registry types;
  types.add<CounterActor>();
  // The typed form derives the same name again: the registry keeps the first and records the
  // problem, naming the type; troupe::run() refuses to start with it (exit 2 on every node,
  // cluster_test), where an exception in main() was an abort.
  CHECK(types.problem().empty());
  types.add<OtherCounterActor>();
  CHECK_THAT(types.problem(), Catch::Contains("actor type 'type_name_test.Counter' is registered "
                                              "twice") &&
                                  Catch::Contains("add<Class>(\"name\")"));
  types.add<OtherCounterActor>("test.OtherCounter");
  CHECK(types.has("test.OtherCounter"));
}
