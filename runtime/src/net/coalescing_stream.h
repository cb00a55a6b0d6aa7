// File: coalescing_stream.h
//
// A `kj::AsyncIoStream` decorator that turns Cap'n Proto's one-syscall-per-message traffic into
// few large syscalls. It sits between a socket and `capnp::TwoPartyVatNetwork`:
//
//     auto stream = kj::heap<troupe::CoalescingStream>(kj::mv(socket));
//     capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::CLIENT);
//
// Why: capnp 0.9.2 writes every RPC message (Call, Return, Finish) with its own `write()` and
// reads each one with two `tryRead()`s, so a pipelined call costs about six syscalls and system
// time dominates (see DESIGN.md section 4). This wrapper
//   * copies small writes into a buffer and resolves them at once (which is what lets the RPC
//     layer, which serializes its writes, hand us the next message in the same event-loop turn),
//   * flushes that buffer once per event-loop turn from a `kj::evalLast()` callback, or as soon
//     as it holds 8 KiB,
//   * writes large buffers straight through, in the same `writev` as whatever was buffered before
//     them, resolving them only once the kernel took them,
//   * serves reads from a 64 KiB read-ahead buffer.
// Measured (DESIGN.md section 4; docs/benchmarks.md "RPC"): syscalls per pipelined call drop
// ~40x and system time per call to < 0.5 us; calls/s rise 1.2-3x depending on how expensive
// syscalls are on the machine.

#pragma once

#include <kj/async-io.h>
#include <kj/common.h>
#include <kj/vector.h>

#include "forwarding_stream.h"

namespace troupe {

class CoalescingStream final : public ForwardingStream, private kj::TaskSet::ErrorHandler {
  // Buffers writes and reads of `inner`; see the file comment. Single-threaded, like every KJ
  // object: use it on the event loop that owns `inner`.
  //
  // Write semantics: a small write's promise resolves once its bytes are copied into the buffer,
  // before they reach the kernel; a large write's promise resolves once it was written. Writes
  // keep their order. Because small writes resolve early, a failure of the underlying socket
  // surfaces on a later write (or on `flush()`); from then on every write fails with that
  // exception. Buffered bytes are bounded: while more than `kMaxPendingBytes` wait for the
  // socket, new writes are still accepted but their promises do not resolve (back-pressure).
  //
  // Bytes still buffered when the stream is destroyed are dropped; wait on `flush()` (or on
  // `shutdownWrite()` followed by `flush()`) first if they matter.

 public:
  explicit CoalescingStream(kj::Own<kj::AsyncIoStream> inner, kj::Timer* timer = nullptr);
  // With `timer`, buffered bytes wait at most kFlushDeadline for the end of the turn (below).
  ~CoalescingStream() noexcept(false);
  KJ_DISALLOW_COPY(CoalescingStream);

  static constexpr size_t kSealBytes = 8 * 1024;
  // The write buffer is sent as soon as it holds this much, without waiting for the end of the
  // turn. Larger values (64 KiB was tried) make the two ends of a connection take turns instead
  // of overlapping.

  static constexpr size_t kDirectWriteBytes = 8 * 1024;
  // Writes of at least this many bytes are not copied; they go to the socket as they are.

  static constexpr kj::Duration kFlushDeadline = 2 * kj::MILLISECONDS;
  // The longest a buffer waits for its end-of-turn flush where a loop never runs dry (given a
  // timer): past it, it is flushed at the loop's next poll.

  static constexpr size_t kMaxPendingBytes = 4 * 1024 * 1024;
  // Back-pressure threshold for copied-but-unsent bytes.

  static constexpr size_t kReadAheadBytes = 64 * 1024;
  // Size of the read-ahead buffer. Reads asking for more than this go straight to `inner`.

  kj::Promise<void> flush();
  // Sends everything written so far now (rather than at the end of the turn) and resolves once
  // it has been handed to the kernel. Rejects with the stream's error if a write failed.

  void abort(kj::Exception&& exception);
  // Ends the stream from this side without waiting for the peer: reads in progress and later
  // ones fail with `exception`, and so do later writes. For fencing a peer that may be frozen or
  // partitioned, where no FIN or RST would ever arrive.

  // kj::AsyncInputStream
  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override;

  // kj::AsyncOutputStream
  kj::Promise<void> write(const void* buffer, size_t size) override;
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override;

  // kj::AsyncIoStream
  void shutdownWrite() override;
  // Deferred until every buffered byte has been written, then forwarded to `inner`. Writing
  // after `shutdownWrite()` is an error.

  // The rest (abortRead, the socket options and names, whenWriteDisconnected) is forwarded to
  // `inner` by ForwardingStream; getFd() is not, so nothing writes behind the buffer's back.

 private:
  struct Chunk {
    // One entry of the send queue: either bytes we own (coalesced small writes) or the pieces of
    // one large write, which the caller keeps alive until `done` is fulfilled.
    kj::Array<kj::byte> owned;  // Capacity kBufferBytes; the first `ownedSize` bytes are data.
    size_t ownedSize = 0;
    kj::Array<kj::ArrayPtr<const kj::byte>> borrowed;
    kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> done;
  };

  // Write side.
  static constexpr size_t kBufferBytes = kSealBytes + kDirectWriteBytes;
  // Capacity of a write buffer: it is sealed at kSealBytes and a small write is shorter than
  // kDirectWriteBytes, so one always fits.

  kj::Array<kj::byte> accumulator;  // Small writes not yet sealed into a chunk.
  size_t accumulatorSize = 0;
  kj::Vector<kj::Array<kj::byte>> spareBuffers;  // Written buffers kept for reuse.
  kj::Vector<Chunk> queue;                       // Sealed chunks waiting for the socket.
  kj::Vector<Chunk> inFlight;                    // Chunks of the write `inner` is performing now.
  kj::Array<kj::ArrayPtr<const kj::byte>> inFlightPieces;
  // The pieces array of the write in progress. `AsyncStreamFd` keeps a pointer into it across
  // partial writes, so it must live until that write completes.
  size_t pendingBytes = 0;  // Copied bytes not yet written (accumulator, queue, inFlight).
  bool writing = false;
  bool flushScheduled = false;
  kj::Timer* timer_;          // for the flush deadline; null: none
  bool deadlineArmed = false;  // a deadline timer is pending
  bool shutdownRequested = false;
  bool shutdownDone = false;
  kj::Maybe<kj::Exception> failure;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> spaceWaiters;  // Back-pressured writes.
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> drainWaiters;  // flush() callers.

  // Read side.
  kj::Canceler readCanceler;  // reads from `inner` in progress; cancelled by abort()
  kj::Maybe<kj::Exception> aborted;
  kj::Array<kj::byte> readBuffer;
  size_t readBegin = 0;
  size_t readEnd = 0;

  kj::TaskSet tasks;  // Declared last: destroyed first, so in-flight writes cancel first.

  kj::Promise<void> writeSmall(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces);
  kj::Promise<void> writeLarge(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces);
  // The two write paths; `write()` picks one by total size.

  void scheduleFlush();
  // Arranges for flushNow() at the end of the current turn, or at the deadline.

  void flushNow();
  // `sealAccumulator()` + `startWrite()`, when a flush is still scheduled.

  void sealAccumulator();
  // Moves the accumulator into the send queue.

  void appendToAccumulator(kj::ArrayPtr<const kj::byte> bytes);

  void startWrite();
  // Starts one `writev` of the whole send queue unless a write is already in progress.

  void onWriteDone();
  void fail(kj::Exception&& exception);
  void maybeFinishDrain();
  // Bookkeeping after a write completed or failed: releases waiters, continues with the queue,
  // performs a deferred `shutdownWrite()`.

  bool isIdle() const;

  void taskFailed(kj::Exception&& exception) override;
};

void setNoDelay(kj::AsyncIoStream& stream);
// Sets TCP_NODELAY on a TCP stream (every troupe socket has it). Throws if `stream` is not a TCP
// socket; pass a `CoalescingStream` or its inner stream alike.

}  // namespace troupe
