// File: lending.h
//
// How a troupe connection's messages hold the SendBuffers they lend (troupe/send_buffer.h) until
// they are written. LendingNetwork stands between the RPC system and the connection's
// capnp::TwoPartyVatNetwork: every message the RPC system builds on the connection (a call, a
// return) is a LendingMessage around the two-party network's own, listed on its thread while it
// is being built. SendBuffer::lend finds the message by the arena its orphanage allocates in and
// gives it a reference to the buffer; send() hands those references to the connection's
// IncomingMessageStream, which drops them once it has written that message (or when the
// connection is gone). A message dropped unsent drops them with itself.
//
//     RpcSystem -> LendingNetwork -> TwoPartyVatNetwork -> IncomingMessageStream -> [TLS] -> socket

#pragma once

#include <capnp/rpc-twoparty.h>

#include <memory>

#include "message_stream.h"

namespace troupe {

class LendingNetwork final : public capnp::TwoPartyVatNetworkBase,
                             private capnp::TwoPartyVatNetworkBase::Connection {
 public:
  LendingNetwork(capnp::TwoPartyVatNetwork& network, IncomingMessageStream& stream);
  KJ_DISALLOW_COPY(LendingNetwork);

  kj::Maybe<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> connect(
      capnp::rpc::twoparty::VatId::Reader vat) override;
  kj::Promise<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> accept() override;

 private:
  class Refs final : public kj::Disposer {
    // Counts the RPC system's references to this connection; the last one let go releases the
    // two-party network's connection, which is how that network learns of the disconnect.
   public:
    explicit Refs(LendingNetwork& network) : network_(network) {}
    void disposeImpl(void* pointer) const override;
    mutable unsigned count = 0;

   private:
    LendingNetwork& network_;
  };

  capnp::TwoPartyVatNetwork& network_;
  IncomingMessageStream& stream_;
  kj::Own<capnp::TwoPartyVatNetworkBase::Connection> inner_;
  Refs refs_{*this};

  kj::Own<capnp::TwoPartyVatNetworkBase::Connection> share(
      kj::Own<capnp::TwoPartyVatNetworkBase::Connection> inner);

  // The connection, passed through but for newOutgoingMessage.
  kj::Own<capnp::RpcFlowController> newStream() override { return inner_->newStream(); }
  capnp::rpc::twoparty::VatId::Reader getPeerVatId() override { return inner_->getPeerVatId(); }
  kj::Own<capnp::OutgoingRpcMessage> newOutgoingMessage(uint firstSegmentWordSize) override;
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> receiveIncomingMessage() override {
    return inner_->receiveIncomingMessage();
  }
  kj::Promise<void> shutdown() override { return inner_->shutdown(); }
};

void holdForMessage(capnp::Orphanage orphanage, std::shared_ptr<void> memory);
// Gives `memory` to the message `orphanage` allocates in, if that is a troupe connection's
// message being built on this thread (it then holds it until written or dropped). Any other
// message (a local call's, a MallocMessageBuilder's) gets nothing: its sender keeps the buffer.

}  // namespace troupe
