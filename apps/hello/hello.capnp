@0x88f3ec8c4b6c0745;
# The seed's hello-world, with actors: one greeter per node reports where it runs.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hello");

using Troupe = import "/troupe.capnp";

interface Greeter extends(Troupe.Actor) {
  greet @0 () -> (host :Text, group :Text, instanceType :Text, vcpus :UInt32, pid :UInt32);
}
