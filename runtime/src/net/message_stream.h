// File: message_stream.h
//
// The message layer under every troupe RPC connection (a capnp::MessageStream over the
// connection's byte stream). Reading differs from Cap'n Proto's own in one way: a message of at
// least kRetainableBytes is read into a shared, registered buffer, so that
// troupe::Received::keep (troupe/received.h) can hold on to bytes inside it after the call that
// carried them returns, without a copy. The buffers of such messages come from a small pool, so a
// stream of 25 MB batches reuses memory the kernel has already mapped instead of faulting in and
// zeroing fresh pages for every batch. troupe::SendBuffer (troupe/send_buffer.h) takes its memory
// from the same pool. Writing is Cap'n Proto's, but for one thing: the stream holds the
// SendBuffers a message lends from the moment the connection sends it until it is written
// (sent(), from LendingNetwork in lending.h).
//
//     socket -> [TLS] -> CoalescingStream -> IncomingMessageStream -> TwoPartyVatNetwork
//                                                                  -> LendingNetwork -> RPC

#pragma once

#include <capnp/serialize-async.h>
#include <kj/async-io.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace troupe {

class IncomingMessageStream final : public capnp::MessageStream {
 public:
  explicit IncomingMessageStream(kj::AsyncIoStream& stream);

  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(
      kj::ArrayPtr<kj::AutoCloseFd> fdSpace, capnp::ReaderOptions options = {},
      kj::ArrayPtr<capnp::word> scratchSpace = nullptr) override;
  kj::Promise<void> writeMessage(
      kj::ArrayPtr<const int> fds,
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

  void sent(std::vector<std::shared_ptr<void>> lent);
  // The connection queued its next message for writing; `lent` is the memory it lends, which the
  // stream keeps until it has written that message (or is destroyed, the message unwritten). The
  // n-th message sent is the n-th written: the two-party network writes in order, one at a time.

  void describePeer(std::string peer) { peer_ = kj::mv(peer); }
  // What the other end is ("node algo-3 (data_group) at 10.0.0.3:7077"). Once set, the
  // connection closing or breaking is a DISCONNECTED exception naming it, which Cap'n Proto
  // hands to every call in flight on the connection (in place of "Peer disconnected.").

 private:
  kj::AsyncIoStream& stream_;
  std::string peer_;
  capnp::AsyncIoMessageStream writer_;
  kj::FixedArray<uint32_t, 2> first_;  // the first word of a segment table
  struct Lent {
    uint64_t message;  // its place among the messages sent
    std::vector<std::shared_ptr<void>> memory;
  };
  std::deque<Lent> lent_;  // of messages sent, not yet written, that lend memory
  uint64_t sent_ = 0, written_ = 0;

  kj::Promise<void> holdLent(kj::Promise<void> write);

  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> readTable(capnp::ReaderOptions options);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> readSegments(kj::Array<uint32_t> sizes,
                                                                  capnp::ReaderOptions options);
};

struct RetainedBuffers {
  // What the pool of large receive buffers holds, for tests and benches.
  size_t live = 0;    // buffers a message or a Received still holds
  size_t pooled = 0;  // free buffers kept for reuse
  size_t pooledBytes = 0;
  uint64_t reused = 0;     // buffers handed out again from the pool
  uint64_t allocated = 0;  // buffers taken from the allocator
};
RetainedBuffers retainedBuffers();

std::shared_ptr<void> pooledBuffer(size_t bytes);
// A buffer of at least `bytes` from the pool (troupe::SendBuffer's memory), registered so that
// Received::keep finds bytes inside it. Its address is that of the shared pointer's.

}  // namespace troupe
