#include "lending.h"

#include <kj/debug.h>

#include <vector>

#include "troupe/send_buffer.h"

namespace troupe {

namespace {

const void* arenaOf(capnp::Orphanage orphanage) {
  // Which message an orphanage allocates in: Cap'n Proto's own accessor for an orphanage's
  // arena (one per message), used only as an identity.
  return capnp::_::OrphanageInternal::getArena(orphanage);
}

class LendingMessage;
// The troupe messages this thread is building (made, not yet sent or dropped), a list through
// the messages themselves: few at a time (the RPC system sends a message in the turn it builds
// it, but for a request a method holds), and nothing for the thread to destroy at its exit.
thread_local LendingMessage* building = nullptr;

class LendingMessage final : public capnp::OutgoingRpcMessage {
 public:
  LendingMessage(kj::Own<capnp::OutgoingRpcMessage> inner, IncomingMessageStream& stream)
      : inner_(kj::mv(inner)),
        stream_(stream),
        arena_(arenaOf(capnp::Orphanage::getForMessageContaining(inner_->getBody()))),
        next_(building) {
    if (next_ != nullptr) next_->prev_ = this;
    building = this;
  }
  ~LendingMessage() noexcept(false) { unlist(); }
  KJ_DISALLOW_COPY(LendingMessage);

  capnp::AnyPointer::Builder getBody() override { return inner_->getBody(); }
  void setFds(kj::Array<int> fds) override { inner_->setFds(kj::mv(fds)); }
  size_t sizeInWords() override { return inner_->sizeInWords(); }
  void send() override {
    unlist();
    inner_->send();
    // Only once the two-party network has queued it: a message it refuses is never written.
    stream_.sent(kj::mv(holds_));
  }

  const void* arena() const { return arena_; }
  LendingMessage* next() const { return next_; }
  void hold(std::shared_ptr<void> memory) { holds_.push_back(kj::mv(memory)); }

 private:
  kj::Own<capnp::OutgoingRpcMessage> inner_;
  IncomingMessageStream& stream_;
  const void* arena_;
  LendingMessage* prev_ = nullptr;  // in `building`, while listed
  LendingMessage* next_;
  bool listed_ = true;
  std::vector<std::shared_ptr<void>> holds_;

  void unlist() {
    if (!listed_) return;
    listed_ = false;
    if (prev_ != nullptr) {
      prev_->next_ = next_;
    } else {
      building = next_;
    }
    if (next_ != nullptr) next_->prev_ = prev_;
  }
};

}  // namespace

void holdForMessage(capnp::Orphanage orphanage, std::shared_ptr<void> memory) {
  auto arena = arenaOf(orphanage);
  for (auto* message = building; message != nullptr; message = message->next()) {
    if (message->arena() == arena) {
      message->hold(kj::mv(memory));
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LendingNetwork

LendingNetwork::LendingNetwork(capnp::TwoPartyVatNetwork& network, IncomingMessageStream& stream)
    : network_(network), stream_(stream) {}

kj::Maybe<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> LendingNetwork::connect(
    capnp::rpc::twoparty::VatId::Reader vat) {
  KJ_IF_MAYBE(inner, network_.connect(vat)) {
    return share(kj::mv(*inner));
  }
  return nullptr;  // the vat is this side
}

kj::Promise<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> LendingNetwork::accept() {
  return network_.accept().then([this](kj::Own<capnp::TwoPartyVatNetworkBase::Connection> inner) {
    return share(kj::mv(inner));
  });
}

kj::Own<capnp::TwoPartyVatNetworkBase::Connection> LendingNetwork::share(
    kj::Own<capnp::TwoPartyVatNetworkBase::Connection> inner) {
  // The two-party network is its own one connection, and the RPC system knows a connection by
  // its address: so is this. The first reference from it is kept; later ones are the same.
  if (inner_.get() == nullptr) inner_ = kj::mv(inner);
  ++refs_.count;
  return kj::Own<capnp::TwoPartyVatNetworkBase::Connection>(this, refs_);
}

void LendingNetwork::Refs::disposeImpl(void*) const {
  if (--count == 0) network_.inner_ = nullptr;
}

kj::Own<capnp::OutgoingRpcMessage> LendingNetwork::newOutgoingMessage(uint firstSegmentWordSize) {
  return kj::heap<LendingMessage>(inner_->newOutgoingMessage(firstSegmentWordSize), stream_);
}

// ---------------------------------------------------------------------------------------------
// SendBuffer

SendBuffer SendBuffer::allocate(size_t bytes) {
  SendBuffer buffer;
  if (bytes == 0) return buffer;
  // Whole words: a lent Data value is read up to the next 8-byte boundary when written.
  buffer.memory_ = pooledBuffer((bytes + 7) / 8 * 8);
  buffer.bytes_ = kj::arrayPtr(static_cast<kj::byte*>(buffer.memory_.get()), bytes);
  return buffer;
}

capnp::Orphan<capnp::Data> SendBuffer::lend(capnp::Orphanage orphanage) const {
  if (bytes_.size() == 0) return orphanage.newOrphanCopy(capnp::Data::Reader());
  holdForMessage(orphanage, memory_);
  return orphanage.referenceExternalData(bytes_.asConst());
}

void SendBuffer::checkSize(size_t element) const {
  KJ_REQUIRE(bytes_.size() % element == 0, "SendBuffer's size is not a whole number of elements",
             bytes_.size(), element);
}

}  // namespace troupe
