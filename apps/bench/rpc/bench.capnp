@0xbca1c1cec8da07fe;
# The echo interfaces bench_rpc measures calls with.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::bench");

using Troupe = import "/troupe.capnp";

interface Echo {
  # Modes (b) and (b2): a plain Cap'n Proto interface, served without the troupe runtime.
  echo @0 (payload :Data) -> (payload :Data);
  # Returns the payload unchanged.
}

interface EchoActor extends(Troupe.Actor) {
  # Mode (c): the same method on a troupe actor, called from the driver on another node.
  echo @0 (payload :Data) -> (payload :Data);
  # Returns the payload unchanged.
}
