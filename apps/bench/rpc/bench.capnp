@0xbca1c1cec8da07fe;
# The echo interface bench_rpc measures raw Cap'n Proto calls with (no troupe runtime involved).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::bench");

interface Echo {
  echo @0 (payload :Data) -> (payload :Data);
  # Returns the payload unchanged.
}
