@0xc3a1d5e0f2b47a19;
# The data plane outside troupe's tree: a Centroids actor on each data node reads its shard of the
# user's dataset and sums each class's transformed images.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("images");

using Troupe = import "/troupe.capnp";

interface Centroids extends(Troupe.Actor) {
  sum @0 (dataset :Text, transform :Text, shard :UInt32, shards :UInt32, seed :UInt64)
      -> (samples :UInt64, digest :UInt64, sums :List(Float64), counts :List(UInt64),
          skipped :List(Text));
  # Shard `shard` of `shards` of the dataset through the transform: per class, the sum of its
  # samples' values (classes x values) and their count; digest: the sum of splitmix64(id) over
  # the ids read (the driver checks every sample once); skipped: files that could not be read.
}
