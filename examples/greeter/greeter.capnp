@0xa41a334b1cde301f;
# An actor interface outside troupe's tree: it extends troupe's Actor, from the installed
# troupe.capnp (troupe_capnp() puts it on the import path).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("greeter");

using Troupe = import "/troupe.capnp";

interface Greeter extends(Troupe.Actor) {
  greet @0 (name :Text) -> (text :Text, host :Text, group :Text);
}
