@0xd3c5a1f2b4e69a07;
# What bench_stream streams batches through: a plain `-> stream` sink (the raw Cap'n Proto
# baseline) and two actors shaped like hetero_train's augmenter and trainer (the troupe path).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::bench");

using Troupe = import "/troupe.capnp";

interface Sink {
  push @0 (batch :Data) -> stream;
  # One batch; Cap'n Proto's flow control paces the sender by the connection's window.
  done @1 () -> (batches :UInt64, bytes :UInt64, checksum :UInt64);
  # What arrived, once every push before it was delivered.
}

struct Figures {
  batches @0 :UInt64;
  bytes @1 :UInt64;
  seconds @2 :Float64;           # from the first push sent to the last batch delivered
  consumerCpuSeconds @3 :Float64;  # the consumer's process (user + system) over the same time
  producerCpuSeconds @4 :Float64;  # every producer's process, summed
  consumerLoopCpuSeconds @5 :Float64;
  # The consumer's event-loop thread alone: receiving, and opening what no crypto thread opens.
}

interface Producer extends(Troupe.Actor) {
  produce @0 (sink :Sink, batches :UInt32, batchBytes :UInt64, credits :UInt32)
      -> (cpuSeconds :Float64) $Troupe.concurrent;
  # Pushes `batches` batches into `sink`, at most `credits` ahead of grant(), as an augmenter
  # does; returns the CPU time its process used meanwhile. $concurrent, as the augmenter's: grant()
  # must reach the producer while it runs.
  grant @1 (credits :UInt32);
}

interface Consumer extends(Troupe.Actor) {
  pull @0 (producers :List(Troupe.ActorAddress), batches :UInt32, batchBytes :UInt64,
           credits :UInt32) -> (figures :Figures);
  # Calls each producer directly (its own connection, as the trainer calls augmenters), hands it
  # a sink, and grants a credit per batch it has read; the producers share `batches` and stream
  # at the same time.
}
