// Tests of troupe::SendBuffer (troupe/send_buffer.h) and troupe::LendingNetwork (net/lending.h)
// over a real socketpair and Cap'n Proto RPC: bytes a message lends arrive as they were when
// lent, even when the SendBuffer is let go of (and its memory could be reused) before the
// message is written, and the memory goes back to the pool once nothing needs it.

#include <catch2/catch.hpp>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <vector>

#include "echo_test.capnp.h"
#include "lending.h"
#include "message_stream.h"
#include "troupe/received.h"
#include "troupe/send_buffer.h"

namespace troupe {
namespace {

constexpr size_t kBig = 3 << 20;  // more than a socketpair holds: its write waits for the reader

void fill(const SendBuffer& buffer, uint8_t seed) {
  auto bytes = buffer.bytes();
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<kj::byte>(i * 7 + seed);
}

bool holdsPattern(kj::ArrayPtr<const kj::byte> bytes, uint8_t seed) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<kj::byte>(i * 7 + seed)) return false;
  }
  return true;
}

// Memory that a freed buffer would be reused for, overwritten: what a producer's next batch does.
void scribbleOverFreed() {
  auto next = SendBuffer::allocate(kBig);
  memset(next.bytes().begin(), 0xee, next.size());
}

class EchoServer final : public test::EchoTest::Server {
  // Checks that each payload holds the pattern of its seq; returns it, lent from a buffer of
  // its own that it lets go of before the return is sent (when `lendResults`).
 public:
  explicit EchoServer(bool lendResults) : lendResults_(lendResults) {}
  std::vector<bool> intact;
  std::vector<bool> copied;

  kj::Promise<void> echo(EchoContext context) override {
    auto params = context.getParams();
    auto payload = params.getPayload();
    intact.push_back(holdsPattern(payload, static_cast<uint8_t>(params.getSeq())));
    copied.push_back(Received::keep(payload).copied());
    auto results = context.getResults();
    results.setSeq(params.getSeq());
    if (lendResults_) {
      auto out = SendBuffer::allocate(payload.size());
      if (out.size() > 0) memcpy(out.bytes().begin(), payload.begin(), payload.size());
      results.adoptPayload(out.lend(results));
    }
    scribbleOverFreed();
    return kj::READY_NOW;
  }

 private:
  bool lendResults_;
};

struct End {
  // One side of an RPC connection as a troupe node makes it.
  End(kj::AsyncIoStream& stream, capnp::rpc::twoparty::Side side,
      kj::Maybe<capnp::Capability::Client> bootstrap)
      : messages(stream),
        network(messages, side),
        lending(network, messages),
        rpc(capnp::makeRpcServer(lending, bootstrapOr(kj::mv(bootstrap)))) {}
  IncomingMessageStream messages;
  capnp::TwoPartyVatNetwork network;
  LendingNetwork lending;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;

  static capnp::Capability::Client bootstrapOr(kj::Maybe<capnp::Capability::Client> c) {
    KJ_IF_MAYBE(client, c) {
      return kj::mv(*client);
    }
    return KJ_EXCEPTION(FAILED, "this end exports nothing");
  }
};

struct Pair {
  explicit Pair(bool lendResults = false) {
    auto server = kj::heap<EchoServer>(lendResults);
    echo = server.get();
    serverEnd = kj::heap<End>(*pipe.ends[1], capnp::rpc::twoparty::Side::SERVER,
                              capnp::Capability::Client(kj::mv(server)));
    clientEnd = kj::heap<End>(*pipe.ends[0], capnp::rpc::twoparty::Side::CLIENT, nullptr);
    capnp::MallocMessageBuilder vatIdMessage;
    auto vatId = vatIdMessage.initRoot<capnp::rpc::twoparty::VatId>();
    vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
    client = clientEnd->rpc.bootstrap(vatId).castAs<test::EchoTest>();
    // One call first, so the bootstrap is resolved and later calls are the connection's own.
    client.echoRequest().send().wait(io.waitScope);
    echo->intact.clear();
    echo->copied.clear();
  }
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  EchoServer* echo;
  kj::Own<End> serverEnd, clientEnd;
  test::EchoTest::Client client = nullptr;
};

TEST_CASE("bytes lent to a call arrive intact though the buffer was let go of at once",
          "[lending]") {
  Pair p;
  auto before = retainedBuffers();
  auto calls = kj::heapArrayBuilder<kj::Promise<void>>(3);
  for (uint32_t seq = 1; seq <= 3; ++seq) {
    auto batch = SendBuffer::allocate(kBig);
    fill(batch, static_cast<uint8_t>(seq));
    auto request = p.client.echoRequest();
    request.setSeq(seq);
    request.adoptPayload(batch.lend(request));
    calls.add(request.send().ignoreResult());
    // `batch` goes here, before the message is written: the connection holds its memory.
  }
  // Promise: the messages hold their buffers, so a new one is not handed their memory.
  CHECK(retainedBuffers().live == before.live + 3);
  scribbleOverFreed();
  kj::joinPromises(calls.finish()).wait(p.io.waitScope);
  p.io.waitScope.poll();
  CHECK(p.echo->intact == std::vector<bool>{true, true, true});
  // Promise: a large message arrives in a pooled buffer the callee keeps without a copy.
  CHECK(p.echo->copied == std::vector<bool>{false, false, false});
  // Promise: once written, the buffers go back to the pool.
  CHECK(retainedBuffers().live == before.live);
}

TEST_CASE("bytes lent to a call's results arrive intact", "[lending]") {
  Pair p(true);
  auto before = retainedBuffers();
  auto batch = SendBuffer::allocate(kBig);
  fill(batch, 9);
  auto request = p.client.echoRequest();
  request.setSeq(9);
  request.adoptPayload(batch.lend(request));
  auto response = request.send().wait(p.io.waitScope);
  batch = SendBuffer();
  CHECK(p.echo->intact == std::vector<bool>{true});
  // Promise: the server's buffer, gone from its method before the return was sent, was held
  // until the return was written.
  CHECK(response.getPayload().size() == kBig);
  CHECK(holdsPattern(response.getPayload(), 9));
  // Promise: then let go of; what is left is the buffer the response was read into.
  p.io.waitScope.poll();
  CHECK(retainedBuffers().live == before.live + 1);
}

TEST_CASE("a message dropped unsent lets go of what it lends", "[lending]") {
  Pair p;
  auto before = retainedBuffers();
  {
    auto batch = SendBuffer::allocate(kBig);
    auto request = p.client.echoRequest();
    request.adoptPayload(batch.lend(request));
    batch = SendBuffer();
    // Promise: the message being built holds the buffer.
    CHECK(retainedBuffers().live == before.live + 1);
  }
  // Promise: dropping the request (and its message) frees it.
  CHECK(retainedBuffers().live == before.live);
}

TEST_CASE("two requests built at once each hold what was lent to it, and only that", "[lending]") {
  Pair p;
  auto before = retainedBuffers();
  auto first = p.client.echoRequest();
  auto second = p.client.echoRequest();
  {
    auto a = SendBuffer::allocate(kBig), b = SendBuffer::allocate(kBig);
    fill(b, 2);
    second.setSeq(2);
    second.adoptPayload(b.lend(second));
    first.adoptPayload(a.lend(first));
  }
  CHECK(retainedBuffers().live == before.live + 2);
  auto sent = second.send();
  // Promise: dropping the first request unsent frees its buffer, not the second's.
  first = nullptr;
  CHECK(retainedBuffers().live == before.live + 1);
  scribbleOverFreed();
  sent.wait(p.io.waitScope);
  p.io.waitScope.poll();
  CHECK(p.echo->intact == std::vector<bool>{true});
  CHECK(retainedBuffers().live == before.live);
}

TEST_CASE("a call in the same process reads lent bytes, and keeps them without a copy",
          "[lending]") {
  kj::EventLoop loop;
  kj::WaitScope waitScope(loop);
  auto server = kj::heap<EchoServer>(false);
  auto& echo = *server;
  test::EchoTest::Client client(kj::mv(server));
  auto batch = SendBuffer::allocate(kBig);
  fill(batch, 4);
  auto request = client.echoRequest();
  request.setSeq(4);
  request.adoptPayload(batch.lend(request));
  // No connection holds it: the caller keeps the buffer until the call completes.
  request.send().attach(kj::mv(batch)).wait(waitScope);
  CHECK(echo.intact == std::vector<bool>{true});
  // Promise: the callee's Received::keep shares the lent buffer rather than copying it.
  CHECK(echo.copied == std::vector<bool>{false});
}

TEST_CASE("SendBuffer: sizes, views, and lending nothing", "[lending]") {
  auto buffer = SendBuffer::allocate(12);
  CHECK(buffer.size() == 12);
  CHECK(buffer.as<float>().size() == 3);
  CHECK(reinterpret_cast<uintptr_t>(buffer.bytes().begin()) % 64 == 0);
  CHECK_THROWS_WITH(buffer.as<double>(), Catch::Contains("not a whole number of elements"));
  capnp::MallocMessageBuilder message;
  auto blob = message.initRoot<test::Blob>();
  blob.adoptData(SendBuffer().lend(blob));
  CHECK(blob.asReader().hasData());
  CHECK(blob.asReader().getData().size() == 0);
  // Lent into a message no connection sends: the bytes are referred to, not copied.
  blob.adoptData(buffer.lend(blob));
  CHECK(blob.asReader().getData().begin() == buffer.bytes().begin());
}

}  // namespace
}  // namespace troupe
