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
  upscale @7 :Int32 = 1;          # work at this many times the image's size (1..4)
  cropAreaMin @8 :Float32 = 1;    # random resized crop's smallest area fraction; 1 = off
}

struct AugmenterArgs {
  # Each augmenter serves shard (instanceIndex) of (instanceCount) of the first `samples` samples.
  seed @0 :UInt64;
  batchSize @1 :UInt32;
  dataDir @2 :Text;               # Fashion-MNIST IDX files (.gz or plain)
  augment @3 :AugmentSettings;
  samples @4 :UInt64;             # 0 = the whole training set
  dataset @5 :Text;
  # Nonempty: a dataset of any kind (troupe/dataset/source.h: an ImageFolder, a manifest,
  # WebDataset shards, IDX files) decoded and transformed by `transform` (troupe/images/
  # transforms.h) instead of the Fashion-MNIST augmenter over dataDir with `augment`.
  transform @6 :Text;
  skipBadSamples @7 :Bool;        # a sample that cannot be read is skipped, not the job's end
  order @8 :BatchOrder;
  python @9 :Bool;
  # The batches come from this process's batch maker (batch_maker.h: a training script's
  # Dataset in its worker processes), as named tensors; `samples` is the dataset's length.
  workers @10 :WorkerArgs;        # with python: how the loader's workers run on each node
  maxImagePixels @11 :UInt64 = 178956970;
  # An image whose header claims more pixels is a bad sample (troupe/images/transforms.h,
  # kMaxImagePixels: PIL's limit); 0: no limit.
  imageFolder @12 :Bool;
  # `dataset` is read as an ImageFolder whatever else lies beside its class folders (a
  # torchvision ImageFolder's root holding a manifest-like dataset_info.json).
  decodeScaling @13 :Bool = true;
  # JPEGs decoded at a DCT scale where the first transform shrinks them (Pipeline::
  # setDecodeScaling): faster, pixels that differ from PIL's; a translated Compose's is off
  # unless the script asks (DataLoader(decode_scaling=True)).
}

struct WorkerArgs {
  # A troupe.data.DataLoader's worker processes on a node (batch_maker.h, WorkerSettings).
  loader @0 :UInt32;              # which of the script's loaders (0: the first it made)
  workers @1 :UInt32;             # per node; 0: the node's CPUs (its share under troupe sim)
  prefetchFactor @2 :UInt32 = 2;  # batches in the making per worker
  sharedMemoryBytes @3 :UInt64 = 1073741824;
  pickled @4 :Data;               # the loader's WorkerSpec, pickled (a loader after the first)
  fetched @5 :Bool;
  # The pickled WorkerSpec is not here: the first augmenter of a process to need it asks its
  # trainer (BatchSink.workerSpec) and the process's others use that copy: the spec (up to 32
  # MiB) leaves the head once per node, not once per augmenter in its spawn arguments.
}

struct BatchOrder {
  # batched: the epoch is cut as torch's DataLoader cuts it (troupe/dataset/epoch.h,
  # BatchedEpoch): every batch whole but the epoch's last, batch k the same samples whoever
  # serves it. Unset: hetero_train's Fashion-MNIST order, per shard.
  batched @0 :Bool;
  shuffle @1 :Bool = true;
  dropLast @2 :Bool;
  rank @3 :UInt32;                # DDP: this trainer's share of the epoch (BatchedEpoch); one
  ranks @4 :UInt32;               # rank (0 or 1 ranks): the whole epoch
  inOrder @5 :Bool;               # the trainer takes the epoch's batches in order (shards of one
                                  # batch; the others wait for the next)
  planned @6 :Bool;
  # Each pass (an iter() of troupe.data.DataLoader) is planned by the script: its sampler's
  # batches, a base seed (ShardPlan), handed to the trainer as it starts (ScriptLearner); the
  # augmenters make what produce() names. shuffle, dropLast, rank and ranks are the script's.
  imageSeed @7 :UInt64;           # planned, a dataset's transform (troupe.data.ImageDataset):
  hasImageSeed @8 :Bool;          # sample i of epoch e draws from mixSeed(imageSeed, e, i); else
                                  # from sampleSeed(the pass's base seed, its position)
}

struct ShardPlan {
  # What a stream of a planned pass makes (BatchOrder.planned): the shard's sample ids by
  # position, where its batches end, and what seeds its samples' random draws.
  ids @0 :List(UInt32);
  ends @1 :List(UInt32);          # each batch's end (a position in ids), ascending; the last is
                                  # ids.size()
  first @2 :UInt64;               # the position of ids[0] in the pass
  baseSeed @3 :UInt64;            # the pass's (torch's base_seed, drawn by the script)
  label @4 :UInt32;               # the script's epoch (its set_epoch, or its iterators)
  places @5 :List(UInt64);        # each id's place in the whole pass of every DDP rank, which
                                  # seeds its draws (PassPlan::places); empty: first + its index
  update @6 :Data;                # the script's Dataset's attributes changed since its DataLoader
                                  # was made, pickled (PassPlan::update); empty: none
}

struct Batch {
  session @0 :UInt64;             # the produce() call it answers
  epoch @1 :UInt32;
  shard @2 :UInt32;
  begin @3 :UInt64;               # position of the first sample in the shard's epoch order
  sampleIds @4 :List(UInt32);
  labels @5 :Data;                # one byte per sample
  images @6 :Data;                # float32, sampleIds.size() x 784, normalised; or empty, and:
  pixels @7 :Data;                # uint8, sampleIds.size() x 784: augmented [0, 1] pixels x 255,
                                  # not normalised (a quarter of the bytes; what augmenters send)
  # A dataset (AugmenterArgs.dataset): `pixels` holds the transform's output of each sample not
  # skipped, in `dtype` (troupe::images::Dtype: 0 uint8, 1 float16, 2 float32), the shape the
  # trainer was given; targets instead of labels.
  dtype @8 :UInt8;
  targets @9 :List(Int64);        # one per sample not skipped
  skipped @10 :List(UInt32);      # of sampleIds: could not be read (--skip-bad-samples)
  skippedFiles @11 :List(Text);   # "file: why", one per skipped id
  failure @12 :Text;              # nonempty: a sample could not be read and the job fails with this
  # A script's batch (AugmenterArgs.python): `pixels` holds every tensor's bytes.
  tensors @13 :List(Tensor);
  structure @14 :Text;            # how the tensors nest (the Python package's encoding)
  warned @15 :List(Text);         # "file: warning": decoded despite libjpeg's warning, as PIL does
}

struct Tensor {
  dtype @0 :Text;                 # numpy's typestr ("<f4", "|u1", "<i8", ...)
  shape @1 :List(Int64);
  offset @2 :UInt64;              # in Batch.pixels
  bytes @3 :UInt64;
}

interface BatchSink {
  push @0 (batch :Batch) -> stream;
  workerSpec @1 () -> (pickled :Data);
  # The loader's pickled WorkerSpec (TrainerArgs.workerSpec), for a process whose augmenters
  # were spawned without it (WorkerArgs.fetched).
}

interface Augmenter extends(Troupe.Actor) {
  produce @0 (session :UInt64, epoch :UInt32, from :UInt64, credits :UInt32, sink :BatchSink,
              shard :UInt32, shards :UInt32, rank :UInt32, ranks :UInt32, plan :ShardPlan)
      -> (end :UInt64, samples :UInt64) $Troupe.concurrent;
  # Streams the batches of `shard` of `shards` (shardIndices; 0 shards: the augmenter's instance
  # count) for `epoch` from position `from` into `sink`, at most `credits` ahead of what grant()
  # has returned; resolves when the last batch was pushed. The trainer hands shards out from a
  # queue per epoch, one at a time to each augmenter, so that a slow or new augmenter takes what
  # it can (docs/hetero_train.md). One stream per shard: a new produce() for a shard replaces
  # that shard's previous stream (the old call ends). $concurrent: grant() must reach the
  # augmenter meanwhile through its mailbox. rank/ranks: a batched order's shards are of that
  # DDP rank's share (BatchedEpoch), one stream per rank and shard. plan: of a planned pass
  # (BatchOrder.planned), what the stream makes; `from` is a batch's start in it.
  grant @1 (session :UInt64, credits :UInt32);
  # The trainer consumed batches of that session's stream: send that many more.
  stats @2 () -> (images :UInt64, augmentSeconds :Float64, batches :UInt64, bytes :UInt64,
                  loadSeconds :Float64);
  # What this incarnation of the augmenter augmented and pushed: images, the CPU seconds its
  # batches took (thread CPU time: gathering and augmenting on the pool, building and sending the
  # push on the event loop), batches and their image bytes. The sizing advisor's augmentation
  # rate per vCPU is images / augmentSeconds. loadSeconds: the CPU seconds its shards took to load
  # (once per incarnation, before its first batch: part of the trainer's wait for it).
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
  checkpointDir @8 :Text;         # where checkpoints go (checkpoint.h); empty: none
  checkpointEvery @9 :UInt32;     # steps between checkpoints; 0: only when stopped early
  checkpointKeep @10 :UInt32 = 2; # the newest this many are kept
  fresh @11 :Bool;                # set the folder's checkpoints aside and start over
  samplesSetting @12 :UInt64;     # --train-samples as given (0 = all): part of the job's identity
  killDuringCheckpoint @13 :UInt32;
  # A test hook: SIGKILL this process during its N-th checkpoint write, after the temporary file
  # is written and synced, before the rename (0 = never).
  script @14 :UInt64;
  # Nonzero: the batches go to a training script in the trainer's own process (the Python package
  # troupe.data; script_learner.h), this one of its streams; zero: hetero_train's MLP.
  sample @15 :SampleFormat;       # what a batch's pixels are: Fashion-MNIST's 784 bytes if unset
  testDataset @16 :Text;          # the MLP's evaluation set (a dataset); empty: dataDir's test set,
                                  # or none with `sample` set (accuracy NaN)
  testTransform @17 :Text;
  order @18 :BatchOrder;          # as the augmenters' (AugmenterArgs.order)
  python @19 :Bool;               # the batches are a script's tensors (AugmenterArgs.python)
  ddp @20 :Ddp;                   # a script's rank among several (order.rank of order.ranks)
  loader @21 :UInt32;             # which of the script's DataLoaders (0: the first it made)
  workerSpec @22 :Data;           # a later loader's workers' spec, pickled: what its augmenters
                                  # fetch once per process (BatchSink.workerSpec)
}

struct Ddp {
  # What torchrun gives each process of a DDP job, for the script's torch.distributed
  # (troupe.data.DataLoader sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and
  # LOCAL_WORLD_SIZE from it): rank 0's address and a free port there.
  masterAddr @0 :Text;
  masterPort @1 :UInt16;
  localRank @2 :UInt32;
  localRanks @3 :UInt32;
  seed @4 :UInt64;
  # The job's seed, drawn by the head once per run, the same on every rank: the order the ranks
  # share a pass in when the script gives no sampler (troupe.data.DataLoader without seed=).
}

struct SampleFormat {
  # One sample as the augmenters' transform writes it (troupe/images/transforms.h's Shape).
  channels @0 :UInt32;
  height @1 :UInt32;
  width @2 :UInt32;
  channelsFirst @3 :Bool;
  dtype @4 :UInt8;                # troupe::images::Dtype
  classes @5 :UInt32;             # targets are in [0, classes)
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
  fromCheckpoint @11 :UInt64;     # samples of this epoch trained on before this run resumed it
  stepCpuSeconds @12 :Float64;    # CPU time of the steps' pool thread (the CPU trainer's compute)
  fillSeconds @13 :Float64;       # of waitSeconds: waiting for the epoch's first batch
  digest @14 :UInt64;             # sum of sampleDigest(id) over every sample trained on (checkpoint.h)
  skipped @15 :UInt64;            # samples that could not be read (--skip-bad-samples): not missing
  abandoned @16 :UInt64;          # samples of an epoch the script left (a break): not trained on,
                                  # not missing
}

struct TrainerCpu {
  # What the trainer's side spent, over this run's train() call.
  batches @0 :UInt64;             # batches received and trained on
  loopSeconds @1 :Float64;        # CPU of the trainer's event-loop thread: receiving batches
                                  # (socket, TLS, messages), checking and queueing them; no steps
  processSeconds @2 :Float64;     # CPU of the trainer's whole process, steps included
  copiedBatches @3 :UInt64;       # batches copied on arrival: from a local augmenter, or small
                                  # (troupe/received.h); the others were trained on in place
  steadyProcessSeconds @4 :Float64;
  # Of processSeconds: from each epoch's first batch to its end (evaluation included), without
  # the wait for the first batch (what the sizing advisor counts per step).
  handoffs @5 :UInt64;
  handoffSeconds @6 :Float64;
  # Steps whose batch was already queued, and the time from the step before each one's end to its
  # start: the learner's per-batch cost beyond the step (learner.h, Handoffs).
}

struct CheckpointReport {
  resumedFrom @0 :Text;           # the checkpoint this run continued; empty: it started fresh
  resumedEpoch @1 :UInt32;        # the epoch it continued (0-based)
  resumedStep @2 :UInt64;
  resumedSamples @3 :UInt64;      # of that epoch, trained on by the earlier run
  written @4 :UInt32;             # checkpoints this run wrote
  writeSeconds @5 :Float64;       # time training waited for them
  last @6 :Text;                  # the newest this run wrote
}

interface Trainer extends(Troupe.Actor) {
  train @0 (epochs :UInt32, sources :List(Troupe.ActorAddress), trainSamples :UInt64)
      -> (epochs :List(EpochReport), device :Text, checkpoints :CheckpointReport, cpu :TrainerCpu,
          skippedFiles :List(Text), warnedFiles :List(Text));
  # A checkpoint in the trainer's folder of this job is resumed: the epochs it finished come back
  # in `epochs` as they were, and training continues the epoch in progress from each shard's
  # acknowledged position.
  progress @1 () -> (epoch :UInt32, steps :UInt64, samples :UInt64, waitSeconds :Float64,
                     seconds :Float64, plannedSteps :UInt64, resumedSteps :UInt64,
                     resumedSamples :UInt64) $Troupe.concurrent;
  # steps and samples count every run of the job; seconds and waitSeconds this run's, which did
  # all but resumedSteps and resumedSamples. $concurrent: a read-only query answered while train()
  # holds the trainer (train() goes through the mailbox: a second train() waits for the first).
  addSources @2 (sources :List(Troupe.ActorAddress)) $Troupe.concurrent;
  # More augmenters for the running train() (a node joined the job): they take shards from the
  # epoch's queue at once.
  retireSources @3 (ids :List(UInt64)) $Troupe.concurrent;
  # These augmenters (by actor id) serve no more: their shards go back to the queue from their
  # acknowledged positions, and they are never asked again (the driver stops them next: they ran
  # outside the data group, which has room again).
}
