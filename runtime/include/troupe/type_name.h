// File: troupe/type_name.h
//
// The name an actor type is registered and spawned under, derived from its Cap'n Proto interface
// so that the registry and the spawner cannot disagree:
//
//   types.add<Greeter>();                     // Greeter is an ActorBase<hello::Greeter>
//   job.spawnEach<hello::Greeter>();          // both use "hello.Greeter"
//
// The name is the schema file's name without `.capnp` (and without folders), a dot, and the
// interface's name in that file: `hello.capnp`'s `Greeter` is "hello.Greeter", a nested
// `Outer.Inner` is "hello.Outer.Inner". It travels in spawn requests and appears in logs and in
// error messages ("'trainer' (train.Trainer #3) on algo-2"). Every process of a job runs the same
// binary, so the name only has to be the same within it.

#pragma once

#include <capnp/schema.h>
#include <kj/debug.h>

#include <string>
#include <type_traits>

#include "troupe.capnp.h"

namespace troupe {

inline std::string actorTypeName(capnp::Schema schema) {
  // The display name is "<file as capnp compile saw it>:<name in the file>".
  std::string display = schema.getProto().getDisplayName();
  auto colon = display.find(':');
  KJ_REQUIRE(colon != std::string::npos, "not a top-level or nested schema type", display);
  std::string file = display.substr(0, colon);
  if (auto slash = file.rfind('/'); slash != std::string::npos) file.erase(0, slash + 1);
  const std::string suffix = ".capnp";
  if (file.size() > suffix.size() && file.ends_with(suffix))
    file.resize(file.size() - suffix.size());
  return file + "." + display.substr(colon + 1);
}

template <typename Interface>
std::string actorTypeName() {
  // The name for a generated interface type (hello::Greeter): "hello.Greeter". Only interfaces
  // that extend troupe's Actor interface are actor types.
  static_assert(std::is_base_of_v<proto::Actor::Client, typename Interface::Client>,
                "an actor interface extends troupe's Actor (`interface X extends(Troupe.Actor)`)");
  return actorTypeName(capnp::Schema::from<Interface>());
}

}  // namespace troupe
