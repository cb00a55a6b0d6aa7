@0xe4aa5b7647536151;
# An echo interface for the CoalescingStream RPC test.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::test");

interface EchoTest {
  echo @0 (seq :UInt32, payload :Data) -> (seq :UInt32, payload :Data);
  # Returns its arguments unchanged.
}

struct Blob {
  # A message of one Data field (message_stream_test.cpp).
  data @0 :Data;
}

struct Texts {
  items @0 :List(Text);
}
