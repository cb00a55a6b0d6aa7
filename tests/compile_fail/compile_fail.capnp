@0xd4f1c2a9e7b3a611;
# Interfaces for the compile-failure snippets: one that is an actor, one that is not.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::compile_fail");

using Troupe = import "/troupe.capnp";

interface Counter extends(Troupe.Actor) {
  add @0 (n :UInt32) -> (total :UInt64);
}

interface Plain {
  add @0 (n :UInt32) -> (total :UInt64);
}
