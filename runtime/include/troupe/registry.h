// File: troupe/registry.h
//
// The actor types a binary can host, registered explicitly in main() and handed to troupe::run().
// The same binary runs on every instance, so every node can host every registered type.

#pragma once

#include <kj/function.h>

#include <map>
#include <string>

#include "troupe/actor.h"
#include "troupe/type_name.h"

namespace troupe {

class Registry {
 public:
  template <typename A>
  Registry& add() {
    // Registers actor class A (an ActorBase<Interface> constructible from ActorContext&) under
    // its interface's name (troupe/type_name.h: hello::Greeter is "hello.Greeter"), the name
    // spawn<hello::Greeter>(placement) uses. Registering a name twice is a bug (two classes
    // serving one interface take a name each with add<A>(name)): the first stays, and run()
    // refuses to start, naming the type (a configuration error, exit 2).
    return add<A>(actorTypeName<typename A::Iface>());
  }

  template <typename A>
  Registry& add(std::string typeName) {
    // Registers actor class A under `typeName`, for spawns that name the type as a string
    // (spawn<Interface>(typeName, placement)). Registering a name twice is a bug (above).
    if (factories_.count(typeName) != 0) {
      if (problem_.empty()) {
        problem_ = "actor type '" + typeName +
                   "' is registered twice in this program (troupe::Registry::add): register a "
                   "second class serving the same interface under a name of its own, "
                   "add<Class>(\"name\"), and spawn it by that name";
      }
      return *this;
    }
    factories_.emplace(typeName, [](kj::Own<ActorContext> context) {
      // One owner for both: the actor's Own, to which the context is attached, so that the
      // context outlives the actor (destroyed first) and goes with its last reference.
      auto actor = kj::heap<A>(*context).attach(kj::mv(context));
      ActorCore& core = *actor;
      typename A::Iface::Client client = kj::mv(actor);
      return Created{client, core};
    });
    return *this;
  }

  struct Created {
    proto::Actor::Client client;
    ActorCore& core;
  };

  bool has(const std::string& typeName) const { return factories_.count(typeName) != 0; }
  // What makes this registry unusable ("" when nothing): run() refuses to start with it.
  const std::string& problem() const { return problem_; }
  std::string names() const;  // "hello.Greeter, train.Trainer", for messages
  Created create(const std::string& typeName, kj::Own<ActorContext> context) const;
  // Throws a FAILED kj::Exception naming the type and the registered ones when unknown.

 private:
  // kj::Function's call operator is not const; creating an actor does not change the registry.
  mutable std::map<std::string, kj::Function<Created(kj::Own<ActorContext>)>> factories_;
  std::string problem_;
};

}  // namespace troupe
