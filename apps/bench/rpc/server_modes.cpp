// bench_rpc's modes measured against its server child (server_modes.h): each mode's Caller and
// the server child's echo for it.

#include "server_modes.h"

#include <string.h>

#include <deque>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>

#include "troupe/transport.h"

namespace troupe::bench {
namespace {

// --- (a) raw TCP ------------------------------------------------------------------------------

class RawCaller final : public Caller {
  // Writes each request with its own write and reads each reply with its own read, like a
  // naive request/response protocol. Writes are chained (one at a time); replies are matched to
  // calls in order by a single read loop.
 public:
  RawCaller(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize)
      : stream(kj::mv(connection)),
        request(kj::heapArray<kj::byte>(payloadSize)),
        reply(kj::heapArray<kj::byte>(payloadSize)),
        lastWrite(kj::READY_NOW),
        readLoop(readReplies().eagerlyEvaluate([this](kj::Exception&& e) { failAll(kj::mv(e)); })) {
    memset(request.begin(), 'x', request.size());
  }

  kj::Promise<void> call() override {
    auto paf = kj::newPromiseAndFulfiller<void>();
    waiting.push_back(kj::mv(paf.fulfiller));
    lastWrite = lastWrite.then([this]() { return stream->write(request.begin(), request.size()); })
                    .eagerlyEvaluate([this](kj::Exception&& e) { failAll(kj::mv(e)); });
    return kj::mv(paf.promise);
  }

 private:
  kj::Own<kj::AsyncIoStream> stream;
  kj::Array<kj::byte> request;
  kj::Array<kj::byte> reply;
  std::deque<kj::Own<kj::PromiseFulfiller<void>>> waiting;
  kj::Promise<void> lastWrite;
  kj::Promise<void> readLoop;

  kj::Promise<void> readReplies() {
    return stream->read(reply.begin(), reply.size()).then([this]() {
      KJ_REQUIRE(!waiting.empty(), "reply without a request");
      waiting.front()->fulfill();
      waiting.pop_front();
      return readReplies();
    });
  }

  void failAll(kj::Exception&& exception) {
    for (auto& waiter : waiting) waiter->reject(kj::cp(exception));
    waiting.clear();
  }
};

kj::Promise<void> echoRaw(kj::AsyncIoStream& stream, kj::ArrayPtr<kj::byte> buffer) {
  return stream.tryRead(buffer.begin(), buffer.size(), buffer.size())
      .then([&stream, buffer](size_t n) -> kj::Promise<void> {
        if (n < buffer.size()) return kj::READY_NOW;  // The client hung up.
        return stream.write(buffer.begin(), buffer.size()).then([&stream, buffer]() {
          return echoRaw(stream, buffer);
        });
      });
}

// --- (b) Cap'n Proto, (b2) Cap'n Proto over the coalescing stream, (b3) that over TLS ----------

class EchoServer final : public Echo::Server {
 protected:
  kj::Promise<void> echo(EchoContext context) override {
    context.getResults().setPayload(context.getParams().getPayload());
    return kj::READY_NOW;
  }
};

class CapnpCaller final : public Caller {
  // A TwoPartyVatNetwork client over `connection`, optionally through the coalescing stream.
 public:
  CapnpCaller(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize, bool coalesce)
      : stream(coalesce ? transport::coalesce(kj::mv(connection)) : kj::mv(connection)),
        network(*stream, capnp::rpc::twoparty::Side::CLIENT),
        rpc(capnp::makeRpcClient(network)),
        echo(bootstrap()),
        payload(kj::heapArray<kj::byte>(payloadSize)) {
    memset(payload.begin(), 'x', payload.size());
  }

  kj::Promise<void> call() override { return sendEcho(echo, payload); }

 private:
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  Echo::Client echo;
  kj::Array<kj::byte> payload;

  Echo::Client bootstrap() {
    capnp::MallocMessageBuilder message;
    auto vatId = message.initRoot<capnp::rpc::twoparty::VatId>();
    vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
    return rpc.bootstrap(vatId).castAs<Echo>();
  }
};

kj::Promise<void> serveStream(kj::Own<kj::AsyncIoStream> stream) {
  auto network = kj::heap<capnp::TwoPartyVatNetwork>(*stream, capnp::rpc::twoparty::Side::SERVER);
  auto rpc = kj::heap(capnp::makeRpcServer(*network, kj::heap<EchoServer>()));
  auto done = network->onDisconnect();
  return done.attach(kj::mv(rpc), kj::mv(network), kj::mv(stream));
}

transport::Tls& benchTls() {
  // Both processes derive the same key pair from this secret, as a job's nodes do from theirs.
  static transport::Tls tls(
      "bench_rpc: the secret both of its processes derive their TLS key from");
  return tls;
}

}  // namespace

kj::Promise<kj::Own<Caller>> connectRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return kj::Own<Caller>(kj::heap<RawCaller>(kj::mv(connection), payloadSize));
}

kj::Promise<void> serveRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  auto buffer = kj::heapArray<kj::byte>(payloadSize);
  auto promise = echoRaw(*connection, buffer);
  return promise.attach(kj::mv(buffer), kj::mv(connection));
}

kj::Promise<kj::Own<Caller>> connectCapnp(kj::Own<kj::AsyncIoStream> connection,
                                          size_t payloadSize) {
  return kj::Own<Caller>(kj::heap<CapnpCaller>(kj::mv(connection), payloadSize, false));
}

kj::Promise<void> serveCapnp(kj::Own<kj::AsyncIoStream> connection, size_t) {
  return serveStream(kj::mv(connection));
}

kj::Promise<kj::Own<Caller>> connectCoalescing(kj::Own<kj::AsyncIoStream> connection,
                                               size_t payloadSize) {
  return kj::Own<Caller>(kj::heap<CapnpCaller>(kj::mv(connection), payloadSize, true));
}

kj::Promise<void> serveCoalescing(kj::Own<kj::AsyncIoStream> connection, size_t) {
  return serveStream(transport::coalesce(kj::mv(connection)));
}

kj::Promise<kj::Own<Caller>> connectTls(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return benchTls()
      .wrapClient(kj::mv(connection))
      .then([payloadSize](kj::Own<kj::AsyncIoStream> secure) {
        return connectCoalescing(kj::mv(secure), payloadSize);
      });
}

kj::Promise<void> serveTls(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return benchTls()
      .wrapServer(kj::mv(connection))
      .then([payloadSize](kj::Own<kj::AsyncIoStream> secure) {
        return serveCoalescing(kj::mv(secure), payloadSize);
      });
}

}  // namespace troupe::bench
