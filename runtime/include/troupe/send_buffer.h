// File: send_buffer.h
//
// Bytes a call sends without building them into its message.
//
// A method's large Data field is normally made in the message: `request.initBatch(n)` has Cap'n
// Proto allocate n fresh bytes, zero them, and the producer writes its data over them. A
// SendBuffer is memory of troupe's (taken from a pool, so already mapped, and not zeroed) that
// the message refers to instead: the producer writes its output once, on any thread, and nothing
// is zeroed or copied before the transport reads it for the socket.
//
//     auto batch = troupe::SendBuffer::allocate(bytes);
//     fill(batch.as<float>());                          // on the loop or a pool thread
//     auto request = trainer.pushRequest();
//     request.adoptImages(batch.lend(request));         // the message refers to batch's bytes
//     return request.send().attach(kj::mv(batch));
//
// How long the bytes live: while the SendBuffer (or a copy) lives, and, for a message to another
// node, for as long as that message needs them: troupe holds the buffer from lend() until the
// connection has written the message (or the message is dropped unsent), so the buffer may be
// let go of as soon as it is lent. A message troupe does not send itself (a call to an actor in
// the same process, a call on a capability that is still a promise) reads the bytes when the
// callee does: keep the SendBuffer until the call completes, as `.attach` above does. Either way
// the callee may keep the bytes past the call with troupe::Received::keep, without a copy.
//
// Don't write into a buffer after lending it (the message may not be sent yet); take another:
// freed buffers go back to the pool.

#pragma once

#include <capnp/blob.h>
#include <capnp/orphan.h>
#include <kj/common.h>

#include <cstddef>
#include <memory>
#include <span>

namespace troupe {

class SendBuffer {
 public:
  SendBuffer() = default;

  static SendBuffer allocate(size_t bytes);
  // `bytes` of memory, 64-byte aligned, contents unspecified (a reused buffer holds what it
  // held). 0 bytes: an empty SendBuffer, as default-constructed.

  kj::ArrayPtr<kj::byte> bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

  template <typename T>
  std::span<T> as() const {
    // The bytes as an array of T. Throws when their size is not a multiple of sizeof(T).
    checkSize(sizeof(T));
    auto bytes = bytes_;
    return {reinterpret_cast<T*>(bytes.begin()), bytes.size() / sizeof(T)};
  }

  capnp::Orphan<capnp::Data> lend(capnp::Orphanage orphanage) const;
  // A Data value in the message `orphanage` allocates in that refers to these bytes; adopt it
  // into a field of that message (`adoptBatch(...)`). An empty SendBuffer lends an empty value.

  template <typename Builder>
  capnp::Orphan<capnp::Data> lend(Builder& inMessage) const {
    // The same, for the message that holds `inMessage` (a request, a struct builder in it).
    return lend(
        capnp::Orphanage::getForMessageContaining<typename Builder::Builds::Builder>(inMessage));
  }

 private:
  std::shared_ptr<void> memory_;  // the pooled buffer; held by messages that lend it, too
  kj::ArrayPtr<kj::byte> bytes_;

  void checkSize(size_t element) const;
};

}  // namespace troupe
