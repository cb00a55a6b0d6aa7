// Tests of troupe::CoalescingStream on real sockets (socketpairs and TCP loopback).

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include "coalescing_stream.h"
#include "echo_test.capnp.h"

namespace troupe {
namespace {

/// Forwards everything to `inner` and counts the write calls that reach it.
class CountingStream final : public kj::AsyncIoStream {
 public:
  explicit CountingStream(kj::Own<kj::AsyncIoStream> inner) : inner(kj::mv(inner)) {}

  size_t writes = 0;

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    return inner->tryRead(buffer, minBytes, maxBytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    ++writes;
    return inner->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    ++writes;
    return inner->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner->whenWriteDisconnected(); }
  void shutdownWrite() override { inner->shutdownWrite(); }

 private:
  kj::Own<kj::AsyncIoStream> inner;
};

struct StreamPair {
  kj::Own<kj::AsyncIoStream> client;
  kj::Own<kj::AsyncIoStream> server;
};

/// A connected pair of TCP sockets over loopback, both with TCP_NODELAY.
StreamPair tcpPair(kj::AsyncIoContext& io) {
  auto address = io.provider->getNetwork().parseAddress("127.0.0.1", 0).wait(io.waitScope);
  auto listener = address->listen();
  auto connectAddress =
      io.provider->getNetwork().parseAddress("127.0.0.1", listener->getPort()).wait(io.waitScope);
  auto connecting = connectAddress->connect();
  StreamPair pair;
  pair.server = listener->accept().wait(io.waitScope);
  pair.client = connecting.wait(io.waitScope);
  setNoDelay(*pair.client);
  setNoDelay(*pair.server);
  return pair;
}

/// Bytes of message `i`: 1..200 bytes of a pattern that depends on `i`.
kj::Array<kj::byte> smallMessage(size_t i) {
  auto bytes = kj::heapArray<kj::byte>(1 + i % 200);
  for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = static_cast<kj::byte>(i * 31 + j);
  return bytes;
}

kj::Array<kj::byte> bigMessage(size_t size, uint seed) {
  auto bytes = kj::heapArray<kj::byte>(size);
  for (size_t j = 0; j < size; ++j) bytes[j] = static_cast<kj::byte>((j * 7 + seed) ^ (j >> 12));
  return bytes;
}

/// Writes `messages` one after the other, each once the previous write resolved (as capnp does).
kj::Promise<void> writeSequentially(kj::AsyncOutputStream& out,
                                    kj::ArrayPtr<const kj::Array<kj::byte>> messages,
                                    size_t i = 0) {
  if (i == messages.size()) return kj::READY_NOW;
  return out.write(messages[i].begin(), messages[i].size()).then([&out, messages, i]() {
    return writeSequentially(out, messages, i + 1);
  });
}

kj::Array<kj::byte> concat(kj::ArrayPtr<const kj::Array<kj::byte>> messages) {
  size_t total = 0;
  for (auto& message : messages) total += message.size();
  auto result = kj::heapArrayBuilder<kj::byte>(total);
  for (auto& message : messages) result.addAll(message);
  return result.finish();
}

bool sameBytes(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b) {
  return a.size() == b.size() && memcmp(a.begin(), b.begin(), a.size()) == 0;
}

TEST_CASE("many small writes arrive intact, in order and coalesced", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  auto counting = kj::heap<CountingStream>(kj::mv(pipe.ends[0]));
  auto& counter = *counting;
  CoalescingStream writer(kj::mv(counting));

  auto messages = kj::heapArrayBuilder<kj::Array<kj::byte>>(10000);
  for (size_t i = 0; i < 10000; ++i) messages.add(smallMessage(i));
  auto all = messages.finish();

  auto received = pipe.ends[1]->readAllBytes();
  writeSequentially(writer, all).wait(io.waitScope);
  writer.shutdownWrite();
  auto bytes = received.wait(io.waitScope);

  CHECK(sameBytes(bytes, concat(all)));
  // ~1 MB in 8 KiB chunks: about 125 writes instead of 10000.
  CHECK(counter.writes < 300);
}

TEST_CASE("a 4 MiB write interleaved with small writes arrives intact", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pair = tcpPair(io);
  CoalescingStream writer(kj::mv(pair.client));

  kj::Vector<kj::Array<kj::byte>> messages;
  for (size_t i = 0; i < 100; ++i) messages.add(smallMessage(i));
  auto big = bigMessage(4 << 20, 1);
  auto received = pair.server->readAllBytes();

  // Small writes queued but not yet flushed, then the big one as two pieces (as capnp's
  // writeMessage() does: segment table, segment), then more small writes.
  writeSequentially(writer, messages.asPtr()).wait(io.waitScope);
  kj::ArrayPtr<const kj::byte> pieces[] = {big.slice(0, 8), big.slice(8, big.size())};
  auto bigWritten = writer.write(kj::arrayPtr(pieces, 2));
  size_t before = messages.size();
  for (size_t i = 0; i < 100; ++i) messages.add(smallMessage(1000 + i));
  writeSequentially(writer, messages.asPtr().slice(before, messages.size())).wait(io.waitScope);
  bigWritten.wait(io.waitScope);
  writer.flush().wait(io.waitScope);
  writer.shutdownWrite();
  auto bytes = received.wait(io.waitScope);

  kj::Vector<kj::byte> expected;
  for (size_t i = 0; i < before; ++i) expected.addAll(messages[i]);
  expected.addAll(big);
  for (size_t i = before; i < messages.size(); ++i) expected.addAll(messages[i]);
  CHECK(bytes.size() == expected.size());
  CHECK(sameBytes(bytes, expected.asPtr()));
}

TEST_CASE("reads with minBytes < maxBytes are served from the read-ahead buffer",
          "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  auto counting = kj::heap<CountingStream>(kj::mv(pipe.ends[1]));
  CoalescingStream reader(kj::mv(counting));
  auto& writer = *pipe.ends[0];

  auto data = bigMessage(100, 2);
  writer.write(data.begin(), data.size()).wait(io.waitScope);
  kj::byte buffer[1000];
  CHECK(reader.tryRead(buffer, 10, 40).wait(io.waitScope) == 40);
  CHECK(sameBytes(kj::arrayPtr(buffer, 40), data.slice(0, 40)));
  // The other 60 bytes were read ahead: returned without waiting for more.
  CHECK(reader.tryRead(buffer, 1, sizeof(buffer)).wait(io.waitScope) == 60);
  CHECK(sameBytes(kj::arrayPtr(buffer, 60), data.slice(40, 100)));

  // minBytes beyond what is buffered: the rest comes from the socket.
  auto more = bigMessage(30, 3);
  writer.write(more.begin(), 30).wait(io.waitScope);
  CHECK(reader.tryRead(buffer, 5, 20).wait(io.waitScope) == 20);
  auto pending = reader.tryRead(buffer, 20, 20);
  auto last = bigMessage(10, 4);
  writer.write(last.begin(), 10).wait(io.waitScope);
  CHECK(pending.wait(io.waitScope) == 20);
  CHECK(sameBytes(kj::arrayPtr(buffer, 10), more.slice(20, 30)));
  CHECK(sameBytes(kj::arrayPtr(buffer + 10, 10), last.asPtr()));

  // A read larger than the read-ahead buffer goes straight into the caller's buffer.
  auto large = bigMessage(300 * 1024, 5);
  auto largeWritten = writer.write(large.begin(), large.size());
  auto target = kj::heapArray<kj::byte>(large.size());
  CHECK(reader.read(target.begin(), 7, 7).wait(io.waitScope) == 7);
  reader.read(target.begin() + 7, target.size() - 7).wait(io.waitScope);
  largeWritten.wait(io.waitScope);
  CHECK(sameBytes(target, large));
}

TEST_CASE("EOF in the middle of a message is reported as a short read", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  CoalescingStream reader(kj::mv(pipe.ends[1]));
  auto& writer = *pipe.ends[0];

  auto data = bigMessage(80, 6);
  writer.write(data.begin(), data.size()).wait(io.waitScope);
  kj::byte buffer[100];
  CHECK(reader.tryRead(buffer, 30, 30).wait(io.waitScope) == 30);
  writer.shutdownWrite();
  // 50 bytes buffered, then EOF: fewer than minBytes means EOF.
  CHECK(reader.tryRead(buffer, 100, 100).wait(io.waitScope) == 50);
  CHECK(sameBytes(kj::arrayPtr(buffer, 50), data.slice(30, 80)));
  CHECK(reader.tryRead(buffer, 1, 100).wait(io.waitScope) == 0);
}

TEST_CASE("read() of a whole message fails on premature EOF", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  CoalescingStream reader(kj::mv(pipe.ends[1]));
  auto data = bigMessage(10, 7);
  pipe.ends[0]->write(data.begin(), data.size()).wait(io.waitScope);
  pipe.ends[0]->shutdownWrite();
  kj::byte buffer[20];
  CHECK_THROWS(reader.read(buffer, 20).wait(io.waitScope));
}

TEST_CASE("a write error is kept and fails later calls", "[coalescing_stream]") {
  signal(SIGPIPE, SIG_IGN);
  auto io = kj::setupAsyncIo();
  auto pair = tcpPair(io);
  CoalescingStream writer(kj::mv(pair.client));
  pair.server = nullptr;  // The peer closes.

  auto chunk = bigMessage(1000, 8);
  kj::Maybe<kj::Exception> error;
  size_t writes = 0;
  for (; writes < 100000 && error == nullptr; ++writes) {
    KJ_IF_MAYBE(exception, kj::runCatchingExceptions([&]() {
                  writer.write(chunk.begin(), chunk.size()).wait(io.waitScope);
                  writer.flush().wait(io.waitScope);
                })) {
      error = kj::mv(*exception);
    }
  }
  REQUIRE(error != nullptr);
  CHECK(writes < 10);
  CHECK(KJ_ASSERT_NONNULL(error).getType() == kj::Exception::Type::DISCONNECTED);
  // Every later call fails the same way, without touching the socket.
  CHECK_THROWS(writer.write(chunk.begin(), chunk.size()).wait(io.waitScope));
  CHECK_THROWS(writer.write(chunk.begin(), chunk.size()).wait(io.waitScope));
  CHECK_THROWS(writer.flush().wait(io.waitScope));
}

TEST_CASE("shutdownWrite waits for pending data", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pair = tcpPair(io);
  CoalescingStream writer(kj::mv(pair.client));

  kj::Vector<kj::Array<kj::byte>> messages;
  for (size_t i = 0; i < 1000; ++i) messages.add(smallMessage(i));
  auto big = bigMessage(1 << 20, 9);
  auto received = pair.server->readAllBytes();

  writeSequentially(writer, messages.asPtr()).wait(io.waitScope);
  auto bigWritten = writer.write(big.begin(), big.size());
  auto tail = smallMessage(5);
  writer.write(tail.begin(), tail.size()).wait(io.waitScope);
  writer.shutdownWrite();  // Data is still buffered here; EOF must come after it.
  CHECK_THROWS(writer.write(tail.begin(), tail.size()));

  auto bytes = received.wait(io.waitScope);
  bigWritten.wait(io.waitScope);
  messages.add(kj::mv(big));
  messages.add(kj::mv(tail));
  CHECK(sameBytes(bytes, concat(messages.asPtr())));
}

TEST_CASE("writes are back-pressured once a few MiB are pending", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  CoalescingStream writer(kj::mv(pipe.ends[0]));

  // Nobody reads: writes resolve at once until kMaxPendingBytes are buffered, then stall.
  auto chunk = bigMessage(1000, 11);
  size_t accepted = 0;
  kj::Maybe<kj::Promise<void>> stalled;
  while (accepted < 64 * CoalescingStream::kMaxPendingBytes) {
    auto written = writer.write(chunk.begin(), chunk.size());
    accepted += chunk.size();
    if (!written.poll(io.waitScope)) {
      stalled = kj::mv(written);
      break;
    }
    written.wait(io.waitScope);
  }
  REQUIRE(stalled != nullptr);
  CHECK(accepted > CoalescingStream::kMaxPendingBytes);
  CHECK(accepted < 2 * CoalescingStream::kMaxPendingBytes);

  // Once the peer drains the socket, the stalled write resolves and every byte arrives.
  auto received = pipe.ends[1]->readAllBytes();
  KJ_ASSERT_NONNULL(stalled).wait(io.waitScope);
  writer.shutdownWrite();
  auto bytes = received.wait(io.waitScope);
  CHECK(bytes.size() == accepted);
}

TEST_CASE("socket options are forwarded", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pair = tcpPair(io);
  CoalescingStream stream(kj::mv(pair.client));
  int sendBuffer = 0;
  kj::uint length = sizeof(sendBuffer);
  stream.getsockopt(SOL_SOCKET, SO_SNDBUF, &sendBuffer, &length);
  CHECK(sendBuffer > 0);
  setNoDelay(stream);
  struct sockaddr_storage address;
  kj::uint addressLength = sizeof(address);
  stream.getpeername(reinterpret_cast<struct sockaddr*>(&address), &addressLength);
  CHECK(address.ss_family == AF_INET);
}

/// Echoes its arguments.
class EchoServer final : public test::EchoTest::Server {
 protected:
  kj::Promise<void> echo(EchoContext context) override {
    auto params = context.getParams();
    auto results = context.getResults();
    results.setSeq(params.getSeq());
    results.setPayload(params.getPayload());
    return kj::READY_NOW;
  }
};

TEST_CASE("capnp RPC over CoalescingStream on both ends", "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  auto pair = tcpPair(io);
  CoalescingStream clientStream(kj::mv(pair.client));
  CoalescingStream serverStream(kj::mv(pair.server));
  capnp::TwoPartyVatNetwork serverNetwork(serverStream, capnp::rpc::twoparty::Side::SERVER);
  auto serverRpc = capnp::makeRpcServer(serverNetwork, kj::heap<EchoServer>());
  capnp::TwoPartyVatNetwork clientNetwork(clientStream, capnp::rpc::twoparty::Side::CLIENT);
  auto clientRpc = capnp::makeRpcClient(clientNetwork);

  capnp::MallocMessageBuilder vatIdMessage;
  auto vatId = vatIdMessage.initRoot<capnp::rpc::twoparty::VatId>();
  vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
  auto echo = clientRpc.bootstrap(vatId).castAs<test::EchoTest>();

  SECTION("10k pipelined calls") {
    constexpr uint kCalls = 10000;
    auto calls = kj::heapArrayBuilder<kj::Promise<void>>(kCalls);
    uint mismatches = 0;
    for (uint i = 0; i < kCalls; ++i) {
      auto request = echo.echoRequest();
      request.setSeq(i);
      auto payload = smallMessage(i);
      request.setPayload(payload);
      calls.add(request.send().then([i, &mismatches](auto response) {
        auto expected = smallMessage(i);
        if (response.getSeq() != i || !sameBytes(response.getPayload(), expected)) ++mismatches;
      }));
    }
    kj::joinPromises(calls.finish()).wait(io.waitScope);
    CHECK(mismatches == 0);
  }

  SECTION("one 4 MiB payload among small calls") {
    auto big = bigMessage(4 << 20, 10);
    auto before = echo.echoRequest();
    before.setSeq(1);
    auto bigRequest = echo.echoRequest();
    bigRequest.setSeq(2);
    bigRequest.setPayload(big);
    auto after = echo.echoRequest();
    after.setSeq(3);
    auto first = before.send();
    auto second = bigRequest.send();
    auto third = after.send();
    CHECK(first.wait(io.waitScope).getSeq() == 1);
    auto response = second.wait(io.waitScope);
    CHECK(response.getSeq() == 2);
    CHECK(sameBytes(response.getPayload(), big));
    CHECK(third.wait(io.waitScope).getSeq() == 3);
  }
}

// A loop that never runs dry: an event queued behind itself, over and over, as a head taking
// hundreds of joins at once has. Polls the port every 256 turns, as troupe's loop does.
kj::Promise<void> busyUntil(const bool& done) {
  if (done) return kj::READY_NOW;
  return kj::evalLater([&done]() { return busyUntil(done); });
}

// Whether a small write reaches the peer within `wait` while the loop is kept busy.
bool arrivesWhileBusy(kj::AsyncIoContext& io, kj::Timer* timer, kj::Duration wait) {
  io.waitScope.setBusyPollInterval(256);
  auto pipe = io.provider->newTwoWayPipe();
  CoalescingStream writer(kj::mv(pipe.ends[0]), timer);
  auto message = smallMessage(7);
  writer.write(message.begin(), message.size()).wait(io.waitScope);  // copied, not yet sent
  bool done = false;
  auto busy = busyUntil(done).eagerlyEvaluate(nullptr);
  auto buffer = kj::heapArray<kj::byte>(message.size());
  bool arrived = io.provider->getTimer()
                     .timeoutAfter(wait, pipe.ends[1]->read(buffer.begin(), buffer.size()))
                     .then([]() { return true; }, [](kj::Exception&&) { return false; })
                     .wait(io.waitScope);
  done = true;
  busy.wait(io.waitScope);
  return arrived && sameBytes(buffer, message);
}

TEST_CASE("a buffered write is sent within the flush deadline on a loop that never runs dry",
          "[coalescing_stream]") {
  auto io = kj::setupAsyncIo();
  // The end-of-turn flush alone never comes while the loop stays busy (the bug this guards
  // against: every join reply of a 512-node cluster held until the last node joined) ...
  CHECK_FALSE(arrivesWhileBusy(io, nullptr, 300 * kj::MILLISECONDS));
  // ... the deadline sends it at the next poll.
  CHECK(arrivesWhileBusy(io, &io.provider->getTimer(), 5 * kj::SECONDS));
}

}  // namespace
}  // namespace troupe
