// Typed registration (troupe/type_name.h, Registry::add<A>()): the name comes from the schema.

#include "troupe/type_name.h"

#include <catch2/catch.hpp>

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
  // The typed form derives the same name again: registering it twice is refused, naming it.
  std::string error;
  try {
    types.add<OtherCounterActor>();
  } catch (const kj::Exception& e) {
    error = e.getDescription().cStr();
  }
  CHECK_THAT(error, Catch::Contains("actor type registered twice") &&
                        Catch::Contains("type_name_test.Counter"));
  types.add<OtherCounterActor>("test.OtherCounter");
  CHECK(types.has("test.OtherCounter"));
}
