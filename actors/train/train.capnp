@0xa441ff599e41a131;
# hetero_train's actors: augmenters (data group) stream augmented batches straight to the trainer
# (dnn group), which pulls them with credits.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hetero");

using Troupe = import "/troupe.capnp";

struct AugmentSettings {
  padding @0 :Int32 = 1;
  flipProbability @1 :Float32 = 0.5;
  maxRotationDegrees @2 :Float32 = 5;
  brightness @3 :Float32 = 0.1;
  contrast @4 :Float32 = 0.1;
  blurKernel @5 :Int32 = 0;       # 0 = no blur; odd 3..99 makes augmentation CPU-heavy
  noiseStddev @6 :Float32 = 0.02;
}

struct AugmenterArgs {
  # Each augmenter serves shard (instanceIndex) of (instanceCount) of the first `samples` samples.
  seed @0 :UInt64;
  batchSize @1 :UInt32;
  dataDir @2 :Text;               # Fashion-MNIST IDX files (.gz or plain)
  augment @3 :AugmentSettings;
  samples @4 :UInt64;             # 0 = the whole training set
}

struct Batch {
  session @0 :UInt64;             # the produce() call it answers
  epoch @1 :UInt32;
  shard @2 :UInt32;
  begin @3 :UInt64;               # position of the first sample in the shard's epoch order
  sampleIds @4 :List(UInt32);
  labels @5 :Data;                # one byte per sample
  images @6 :Data;                # float32, sampleIds.size() x 784, normalised
}

interface BatchSink {
  push @0 (batch :Batch) -> stream;
}

interface Augmenter extends(Troupe.Actor) {
  produce @0 (session :UInt64, epoch :UInt32, from :UInt64, credits :UInt32, sink :BatchSink,
              shard :UInt32) -> (end :UInt64, samples :UInt64);
  # Streams the batches of `shard` for `epoch` from position `from` into `sink`, at most `credits`
  # ahead of what grant() has returned; resolves when the last batch was pushed. `shard` is
  # normally the augmenter's own (its instanceIndex); another one when the trainer hands it the
  # shard of an augmenter that is gone for good. One stream per shard: a new produce() for a shard
  # replaces that shard's previous stream.
  grant @1 (session :UInt64, credits :UInt32);
  # The trainer consumed batches of that session's stream: send that many more.
}

struct TrainerArgs {
  batchSize @0 :UInt32;
  learningRate @1 :Float32 = 0.05;
  momentum @2 :Float32 = 0.9;
  seed @3 :UInt64;
  prefetch @4 :UInt32 = 4;        # batches in flight per augmenter
  dataDir @5 :Text;
  modelDir @6 :Text;              # empty: do not save
  device @7 :Text;                # "auto", "cpu" or "cuda"
}

struct EpochReport {
  epoch @0 :UInt32;
  samples @1 :UInt64;
  duplicates @2 :UInt64;
  missing @3 :UInt64;
  rejected @4 :UInt64;            # batches refused (stale, wrong shape or ids)
  testAccuracy @5 :Float64;
  seconds @6 :Float64;
  steps @7 :UInt64;
  stepSeconds @8 :Float64;        # time in training steps
  waitSeconds @9 :Float64;        # time waiting for data
  loss @10 :Float64;
}

interface Trainer extends(Troupe.Actor) {
  train @0 (epochs :UInt32, sources :List(Troupe.ActorAddress), trainSamples :UInt64)
      -> (epochs :List(EpochReport), device :Text);
  progress @1 () -> (epoch :UInt32, steps :UInt64, samples :UInt64, waitSeconds :Float64,
                     seconds :Float64, plannedSteps :UInt64);
}
