// File: received.h
//
// Bytes that arrived in a call, kept past the call without a copy.
//
// Cap'n Proto hands a method its parameters as a reader into the received message, and that
// message is freed when the call returns. A method that wants to use a large Data field later (a
// trainer queueing a batch until its step) would have to copy it. `Received::keep` instead takes
// a reference on the buffer the message was read into:
//
//     kj::Promise<void> push(PushContext call) override {
//       auto images = troupe::Received::keep(call.getParams().getBatch().getImages());
//       queue_.push_back(kj::mv(images));  // valid after push() returns; no copy was made
//       return kj::READY_NOW;
//     }
//
// Every message of at least kRetainableBytes that a troupe node receives is read into such a
// buffer (runtime/src/net/message_stream.h). Smaller messages, and bytes that did not come from a
// received message (a local call, a message built in this process), are copied once instead;
// `copied()` says which happened. Either way the bytes stay valid, unchanged, for as long as the
// Received (or a copy of it) lives, and it may be released on any thread.
//
// The cost of keeping: the whole received message stays in memory, not only the bytes kept.

#pragma once

#include <capnp/blob.h>
#include <kj/common.h>

#include <cstddef>
#include <memory>
#include <span>

namespace troupe {

class Received {
 public:
  Received() = default;

  static Received keep(capnp::Data::Reader bytes);
  // `bytes` must point into a message this thread can still read (a call's parameters before
  // the call returns, say).

  kj::ArrayPtr<const kj::byte> bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  bool copied() const { return copied_; }

  template <typename T>
  std::span<const T> as() const {
    // The bytes as an array of T. Throws when their size is not a multiple of sizeof(T) or they
    // are not aligned for T (a Data field in a Cap'n Proto message is 8-byte aligned).
    checkLayout(sizeof(T), alignof(T));
    return {reinterpret_cast<const T*>(bytes_.begin()), bytes_.size() / sizeof(T)};
  }

 private:
  kj::ArrayPtr<const kj::byte> bytes_;
  std::shared_ptr<const void> owner_;  // keeps bytes_ alive
  bool copied_ = false;

  void checkLayout(size_t size, size_t align) const;
};

constexpr size_t kRetainableBytes = 64 * 1024;
// Received messages at least this large are read into buffers Received::keep can hold on to.

}  // namespace troupe
