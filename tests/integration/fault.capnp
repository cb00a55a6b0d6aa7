@0xa7dfb69edf65f669;
# Arguments of the integration tests' scripted augmenter (fault_app.cpp): it serves the batches the
# trainer expects, and can push malformed ones in front of one of them.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fault");

struct ScriptedAugmenterArgs {
  seed @0 :UInt64;
  batchSize @1 :UInt32;
  samples @2 :UInt64;
  corrupt @3 :Bool;   # in epoch 0, push five malformed batches before the shard's second batch
}
