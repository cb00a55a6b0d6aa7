// File: crypto_threads.h
//
// The threads that open TLS records for a node's connections while its event loop goes on
// reading sockets (and, on machines with CPUs to spare, seal them while it writes). A dnn node fed
// by several data nodes receives one encrypted stream from each; opened on its event loop, they
// would be decrypted one after another on one core. A TlsStream whose reader asks for a large
// message (a batch) hands each run of whole records it has read to one of these threads and reads
// the next run from the socket meanwhile, so the streams of several data nodes are decrypted on as
// many cores (docs/benchmarks.md, "Encrypted ingest").
//
// Process-wide, like the compute pool, and apart from it: a training step on the pool must not
// hold up ingest. Started on first use, one per online CPU up to kMaxThreads; each stream keeps
// the one it was given.

#pragma once

#include <kj/async.h>

#include <cstddef>

namespace troupe {

class CryptoThreads {
 public:
  static constexpr size_t kMaxThreads = 8;

  static const kj::Executor& pick();
  // A thread for one more stream: a new one while fewer than min(CPUs, kMaxThreads) run, else the
  // next in turn. Thread-safe.

  static size_t started();  // how many run now, for tests and benches

  static constexpr unsigned kSealElsewhereCpus = 4;
  static bool sealElsewhere();
  // Whether a stream's large writes are sealed here too, while its event loop sends: where the
  // machine has kSealElsewhereCpus CPUs or more. With fewer, the two ends of a stream and the
  // threads that open records already share every core, and handing the cipher to another thread
  // only adds the hand-offs (docs/benchmarks.md, "Encrypted ingest").
  static void sealElsewhere(kj::Maybe<bool> forced);
  // Tests: seal elsewhere, or not, whatever the CPUs; nullptr goes back to the CPUs' say.
};

}  // namespace troupe
