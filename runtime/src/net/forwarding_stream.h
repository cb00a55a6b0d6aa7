// File: forwarding_stream.h
//
// The base of every stream decorator in net/ (TLS, the coalescing stream, the pre-login limit):
// each override below hands the call to `inner_`, so a decorator overrides only what it changes
// and the socket options (SO_SNDBUF sizes capnp's flow-control window), names and shutdowns reach
// the socket without a hand-written copy per class.

#pragma once

#include <kj/async-io.h>

namespace troupe {

class ForwardingStream : public kj::AsyncIoStream {
 public:
  explicit ForwardingStream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    return inner_->tryRead(buffer, minBytes, maxBytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    inner_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    inner_->getpeername(addr, length);
  }
  // getFd() is not forwarded: a decorator that buffers or encrypts must not let anything write
  // to the socket behind its back. One that does neither (PreLoginLimit) forwards it itself.

 protected:
  kj::Own<kj::AsyncIoStream> inner_;
};

}  // namespace troupe
