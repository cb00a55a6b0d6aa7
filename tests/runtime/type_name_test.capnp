@0xad43c3f3d96ded13;
# Actor interfaces for type_name_test: a top-level one and a nested one.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::test");

using Troupe = import "/troupe.capnp";

interface Counter extends(Troupe.Actor) {
  add @0 (n :UInt32) -> (total :UInt64);
}

struct Outer {
  interface Inner extends(Troupe.Actor) {}
}
