@0xa7dfb69edf65f669;
# Arguments of the integration tests' scripted augmenter (fault_app.cpp): it serves the batches the
# trainer expects, and can push malformed ones in front of one of them.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fault");

struct ScriptedAugmenterArgs {
  seed @0 :UInt64;
  batchSize @1 :UInt32;
  samples @2 :UInt64;
  corrupt @3 :Bool;   # in epoch 0, push malformed batches before the shard's second batch
  tensors @4 :Bool;   # a script's batches (TrainerArgs.python): each sample's row of 784 float32
                      # holding its id, and its id as an int64 target; malformed: four tensors
                      # whose dtype or shape lies about their bytes
}
