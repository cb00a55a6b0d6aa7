// Tests of troupe::IncomingMessageStream and troupe::Received (troupe/received.h) on real
// socketpairs: what a node reads is what was written, and bytes kept from a large message stay
// valid, uncopied, after the message is gone.

#include <catch2/catch.hpp>

#include <capnp/message.h>
#include <capnp/serialize-async.h>
#include <capnp/serialize.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <numeric>

#include "echo_test.capnp.h"
#include "message_stream.h"
#include "troupe/received.h"

namespace troupe {
namespace {

// A message whose root is a Blob of `size` bytes, byte i holding (i * 7 + seed) & 0xff.
kj::Own<capnp::MallocMessageBuilder> blobMessage(size_t size, uint8_t seed) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto data = message->initRoot<test::Blob>().initData(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<kj::byte>(i * 7 + seed);
  return message;
}

bool holdsPattern(kj::ArrayPtr<const kj::byte> bytes, uint8_t seed) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<kj::byte>(i * 7 + seed)) return false;
  }
  return true;
}

struct Pipe {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  IncomingMessageStream in{*pipe.ends[1]};
};

capnp::MessageReaderAndFds readOne(Pipe& p, capnp::ReaderOptions options = {}) {
  auto got = p.in.tryReadMessage(nullptr, options).wait(p.io.waitScope);
  KJ_IF_MAYBE(m, got) {
    return kj::mv(*m);
  }
  FAIL("the stream ended before a message");
  KJ_UNREACHABLE;
}

TEST_CASE("a large message is read intact and its bytes are kept without a copy",
          "[message_stream]") {
  Pipe p;
  auto before = retainedBuffers();
  const size_t size = 3 << 20;
  auto message = blobMessage(size, 1);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
  Received kept;
  {
    auto got = readOne(p);
    write.wait(p.io.waitScope);
    auto data = got.reader->getRoot<test::Blob>().getData();
    REQUIRE(data.size() == size);
    kept = Received::keep(data);
    // Promise: bytes of a message of kRetainableBytes or more are kept, not copied.
    CHECK_FALSE(kept.copied());
    CHECK(kept.bytes().begin() == data.begin());
    CHECK(retainedBuffers().live == before.live + 1);
  }
  // Promise: the kept bytes outlive the message, unchanged.
  CHECK(holdsPattern(kept.bytes(), 1));
  CHECK(kept.as<float>().size() == size / sizeof(float));
  kept = Received();
  // Promise: the buffer goes back to the pool when its last holder lets go.
  CHECK(retainedBuffers().live == before.live);
  CHECK(retainedBuffers().pooled >= 1);
}

TEST_CASE("the next large message reuses a pooled buffer", "[message_stream]") {
  Pipe p;
  const size_t size = 2 << 20;
  for (uint8_t round = 0; round < 3; ++round) {
    auto before = retainedBuffers();
    auto message = blobMessage(size, round);
    auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
    auto got = readOne(p);
    write.wait(p.io.waitScope);
    // Promise: each message is read intact, whichever buffer it landed in.
    CHECK(holdsPattern(got.reader->getRoot<test::Blob>().getData(), round));
    if (round > 0) CHECK(retainedBuffers().reused == before.reused + 1);
  }
}

TEST_CASE("bytes of a small message, or of a local one, are copied once", "[message_stream]") {
  Pipe p;
  auto message = blobMessage(1000, 3);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
  Received kept;
  {
    auto got = readOne(p);
    write.wait(p.io.waitScope);
    kept = Received::keep(got.reader->getRoot<test::Blob>().getData());
  }
  // Promise: below kRetainableBytes the bytes are copied, and the copy is right.
  CHECK(kept.copied());
  CHECK(holdsPattern(kept.bytes(), 3));

  auto local = blobMessage(1 << 20, 4);
  auto fromLocal = Received::keep(local->getRoot<test::Blob>().getData());
  local = nullptr;
  // Promise: bytes that did not arrive in a received message are copied too.
  CHECK(fromLocal.copied());
  CHECK(holdsPattern(fromLocal.bytes(), 4));
}

TEST_CASE("messages of many segments, odd and even counts, are read intact", "[message_stream]") {
  Pipe p;
  for (size_t texts : {1, 2, 5}) {
    // A tiny first segment forces one segment per text.
    capnp::MallocMessageBuilder message(1, capnp::AllocationStrategy::FIXED_SIZE);
    auto list = message.initRoot<test::Texts>().initItems(texts);
    for (size_t i = 0; i < texts; ++i) list.set(i, kj::str("text ", i, " ", kj::repeat('x', 40)));
    auto segments = message.getSegmentsForOutput().size();
    auto write = capnp::writeMessage(*p.pipe.ends[0], message);
    auto got = readOne(p);
    write.wait(p.io.waitScope);
    auto items = got.reader->getRoot<test::Texts>().getItems();
    INFO(segments << " segments");
    REQUIRE(items.size() == texts);
    for (size_t i = 0; i < texts; ++i) {
      // Promise: every segment arrives where the segment table says.
      CHECK(items[i] == kj::str("text ", i, " ", kj::repeat('x', 40)));
    }
  }
}

TEST_CASE("a message over the traversal limit is refused before it is read", "[message_stream]") {
  Pipe p;
  auto message = blobMessage(1 << 20, 5);
  auto write = capnp::writeMessage(*p.pipe.ends[0], *message);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = (512 << 10) / sizeof(capnp::word);
  // Promise: the receiver's limit holds, with capnp's own words for it.
  CHECK_THROWS_WITH(p.in.tryReadMessage(nullptr, options).wait(p.io.waitScope),
                    Catch::Contains("Message is too large"));
}

TEST_CASE("EOF between messages ends the stream and EOF inside one is an error", "[message_stream]") {
  {
    Pipe p;
    p.pipe.ends[0]->shutdownWrite();
    // Promise: a clean end of stream is "no more messages", not an error.
    CHECK(p.in.tryReadMessage(nullptr).wait(p.io.waitScope) == nullptr);
  }
  {
    Pipe p;
    auto message = blobMessage(1 << 20, 6);
    auto segments = message->getSegmentsForOutput();
    auto flat = capnp::messageToFlatArray(segments);
    auto bytes = flat.asBytes();
    auto& out = *p.pipe.ends[0];
    auto half = out.write(bytes.begin(), bytes.size() / 2).then([&out]() { out.shutdownWrite(); });
    auto writing = half.eagerlyEvaluate(nullptr);
    // Promise: a message cut short is a DISCONNECTED error, never a truncated message.
    try {
      p.in.tryReadMessage(nullptr).wait(p.io.waitScope);
      FAIL("a truncated message was accepted");
    } catch (const kj::Exception& e) {
      CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
      CHECK_THAT(e.getDescription().cStr(), Catch::Contains("premature EOF"));
    }
  }
}

TEST_CASE("Received::as refuses a size or alignment that does not fit the type",
          "[message_stream]") {
  auto local = blobMessage(10, 7);
  auto kept = Received::keep(local->getRoot<test::Blob>().getData());
  // Promise: a bad reinterpretation is an error, never a silent truncation.
  CHECK_THROWS_WITH(kept.as<float>(), Catch::Contains("not a whole number"));
}

}  // namespace
}  // namespace troupe
