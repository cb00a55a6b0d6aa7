#include "coalescing_stream.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include <kj/debug.h>

namespace troupe {

namespace {

size_t totalSize(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  size_t total = 0;
  for (auto& piece : pieces) total += piece.size();
  return total;
}

}  // namespace

CoalescingStream::CoalescingStream(kj::Own<kj::AsyncIoStream> inner, kj::Timer* timer)
    : ForwardingStream(kj::mv(inner)),
      timer_(timer),
      readBuffer(kj::heapArray<kj::byte>(kReadAheadBytes)),
      tasks(*this) {}

CoalescingStream::~CoalescingStream() noexcept(false) {}

// ---------------------------------------------------------------------------------------------
// Reading

kj::Promise<size_t> CoalescingStream::tryRead(void* buffer, size_t minBytes, size_t maxBytes) {
  auto out = static_cast<kj::byte*>(buffer);
  size_t n = kj::min(readEnd - readBegin, maxBytes);
  if (n > 0) {
    memcpy(out, readBuffer.begin() + readBegin, n);
    readBegin += n;
    if (readBegin == readEnd) readBegin = readEnd = 0;
  }
  if (n >= minBytes) return n;
  KJ_IF_MAYBE(e, aborted) {
    return kj::cp(*e);
  }

  // The read-ahead buffer is empty now. Pass the remaining minimum down: a short result from
  // `inner` means EOF, and only if it is short of what our caller needs.
  size_t minRest = minBytes - n;
  size_t maxRest = maxBytes - n;
  if (maxRest >= kReadAheadBytes) {
    return readCanceler.wrap(inner_->tryRead(out + n, minRest, maxRest)).then([n](size_t got) {
      return n + got;
    });
  }
  return readCanceler.wrap(inner_->tryRead(readBuffer.begin(), minRest, readBuffer.size()))
      .then([this, out, n, maxRest](size_t got) {
        size_t take = kj::min(got, maxRest);
        memcpy(out + n, readBuffer.begin(), take);
        readBegin = take;
        readEnd = got;
        if (readBegin == readEnd) readBegin = readEnd = 0;
        return n + take;
      });
}

// ---------------------------------------------------------------------------------------------
// Writing

kj::Promise<void> CoalescingStream::write(const void* buffer, size_t size) {
  auto piece = kj::arrayPtr(static_cast<const kj::byte*>(buffer), size);
  auto pieces = kj::arrayPtr(&piece, 1);
  return size >= kDirectWriteBytes ? writeLarge(pieces) : writeSmall(pieces);
}

kj::Promise<void> CoalescingStream::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  return totalSize(pieces) >= kDirectWriteBytes ? writeLarge(pieces) : writeSmall(pieces);
}

kj::Promise<void> CoalescingStream::writeSmall(
    kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  KJ_IF_MAYBE(exception, failure) {
    return kj::cp(*exception);
  }
  KJ_REQUIRE(!shutdownRequested, "write() after shutdownWrite()");

  for (auto& piece : pieces) appendToAccumulator(piece);
  if (accumulatorSize >= kSealBytes) {
    sealAccumulator();
    startWrite();
  } else {
    scheduleFlush();
  }

  if (pendingBytes > kMaxPendingBytes) {
    auto paf = kj::newPromiseAndFulfiller<void>();
    spaceWaiters.add(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }
  return kj::READY_NOW;
}

kj::Promise<void> CoalescingStream::writeLarge(
    kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  KJ_IF_MAYBE(exception, failure) {
    return kj::cp(*exception);
  }
  KJ_REQUIRE(!shutdownRequested, "write() after shutdownWrite()");

  // Whatever was buffered before goes first, in the same writev when possible.
  sealAccumulator();
  auto paf = kj::newPromiseAndFulfiller<void>();
  Chunk chunk;
  chunk.borrowed = kj::heapArray(pieces);
  chunk.done = kj::mv(paf.fulfiller);
  queue.add(kj::mv(chunk));
  startWrite();
  return kj::mv(paf.promise);
}

kj::Promise<void> CoalescingStream::flush() {
  KJ_IF_MAYBE(exception, failure) {
    return kj::cp(*exception);
  }
  sealAccumulator();
  startWrite();
  if (isIdle()) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  drainWaiters.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void CoalescingStream::appendToAccumulator(kj::ArrayPtr<const kj::byte> bytes) {
  if (bytes.size() == 0) return;
  if (accumulator == nullptr) {
    if (spareBuffers.empty()) {
      accumulator = kj::heapArray<kj::byte>(kBufferBytes);
    } else {
      accumulator = kj::mv(spareBuffers.back());
      spareBuffers.removeLast();
    }
  }
  KJ_ASSERT(accumulatorSize + bytes.size() <= accumulator.size(), accumulatorSize, bytes.size());
  memcpy(accumulator.begin() + accumulatorSize, bytes.begin(), bytes.size());
  accumulatorSize += bytes.size();
  pendingBytes += bytes.size();
}

void CoalescingStream::scheduleFlush() {
  if (flushScheduled) return;
  flushScheduled = true;
  // evalLast, not evalLater: the RPC layer chains each message write onto the previous one, so
  // the messages of one burst arrive over several queued events; evalLater would run before them.
  tasks.add(kj::evalLast([this]() { flushNow(); }));
  // An evalLast event runs only once nothing else is queued. A loop that never runs dry (a head
  // taking 500 joins at once: every poll queues more) would hold the buffer for as long as that
  // lasts - seen: every join reply held 13 s, until the last node joined, and the first ones
  // declared lost for no heartbeat. The deadline bounds it: the timer's event is queued at the
  // next poll like any I/O, ahead of the evalLast. Armed at most once per deadline per stream.
  if (timer_ != nullptr && !deadlineArmed) {
    deadlineArmed = true;
    tasks.add(timer_->afterDelay(kFlushDeadline).then([this]() {
      deadlineArmed = false;
      flushNow();
    }));
  }
}

void CoalescingStream::flushNow() {
  if (!flushScheduled) return;
  flushScheduled = false;
  sealAccumulator();
  startWrite();
  maybeFinishDrain();
}

void CoalescingStream::sealAccumulator() {
  if (accumulatorSize == 0) return;
  Chunk chunk;
  chunk.owned = kj::mv(accumulator);
  chunk.ownedSize = accumulatorSize;
  accumulatorSize = 0;
  queue.add(kj::mv(chunk));
}

void CoalescingStream::startWrite() {
  if (writing || queue.empty() || failure != nullptr) return;
  writing = true;

  // Swap rather than move so both vectors keep their capacity.
  auto spent = kj::mv(inFlight);
  inFlight = kj::mv(queue);
  queue = kj::mv(spent);
  queue.clear();

  size_t count = 0;
  for (auto& chunk : inFlight) count += chunk.borrowed == nullptr ? 1 : chunk.borrowed.size();
  auto pieces = kj::heapArrayBuilder<kj::ArrayPtr<const kj::byte>>(count);
  for (auto& chunk : inFlight) {
    if (chunk.borrowed == nullptr) {
      pieces.add(chunk.owned.slice(0, chunk.ownedSize).asConst());
    } else {
      pieces.addAll(chunk.borrowed);
    }
  }
  inFlightPieces = pieces.finish();

  auto promise = kj::evalNow([this]() { return inner_->write(inFlightPieces); });
  tasks.add(promise.then([this]() { onWriteDone(); },
                         [this](kj::Exception&& exception) { fail(kj::mv(exception)); }));
}

void CoalescingStream::onWriteDone() {
  writing = false;
  for (auto& chunk : inFlight) {
    if (chunk.owned != nullptr) {
      pendingBytes -= chunk.ownedSize;
      if (spareBuffers.size() < 4) spareBuffers.add(kj::mv(chunk.owned));
    }
    KJ_IF_MAYBE(done, chunk.done) {
      (*done)->fulfill();
    }
  }
  inFlight.clear();
  inFlightPieces = nullptr;

  if (pendingBytes <= kMaxPendingBytes) {
    for (auto& waiter : spaceWaiters) waiter->fulfill();
    spaceWaiters.clear();
  }
  startWrite();
  maybeFinishDrain();
}

void CoalescingStream::fail(kj::Exception&& exception) {
  writing = false;
  if (failure == nullptr) failure = kj::mv(exception);
  auto& error = KJ_ASSERT_NONNULL(failure);
  auto rejectAll = [&](kj::Vector<Chunk>& chunks) {
    for (auto& chunk : chunks) {
      KJ_IF_MAYBE(done, chunk.done) {
        (*done)->reject(kj::cp(error));
      }
    }
    chunks.clear();
  };
  rejectAll(inFlight);
  rejectAll(queue);
  inFlightPieces = nullptr;
  accumulator = nullptr;
  accumulatorSize = 0;
  pendingBytes = 0;
  for (auto& waiter : spaceWaiters) waiter->reject(kj::cp(error));
  spaceWaiters.clear();
  for (auto& waiter : drainWaiters) waiter->reject(kj::cp(error));
  drainWaiters.clear();
}

bool CoalescingStream::isIdle() const {
  return !writing && queue.empty() && accumulatorSize == 0;
}

void CoalescingStream::maybeFinishDrain() {
  if (!isIdle() || failure != nullptr) return;
  for (auto& waiter : drainWaiters) waiter->fulfill();
  drainWaiters.clear();
  if (shutdownRequested && !shutdownDone) {
    shutdownDone = true;
    inner_->shutdownWrite();
  }
}

void CoalescingStream::taskFailed(kj::Exception&& exception) {
  fail(kj::mv(exception));
}

// ---------------------------------------------------------------------------------------------
// Forwarded socket operations

void CoalescingStream::shutdownWrite() {
  if (shutdownRequested) return;
  shutdownRequested = true;
  maybeFinishDrain();  // Otherwise the write completion that empties the queue does it.
}

void CoalescingStream::abort(kj::Exception&& exception) {
  // Buffers a write in progress still points into stay as they are: that write is cancelled
  // when the stream is destroyed (`tasks` goes first).
  if (failure == nullptr) failure = kj::cp(exception);
  if (aborted == nullptr) aborted = kj::cp(exception);
  readCanceler.cancel(kj::mv(exception));
}

void setNoDelay(kj::AsyncIoStream& stream) {
  int one = 1;
  stream.setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace troupe
