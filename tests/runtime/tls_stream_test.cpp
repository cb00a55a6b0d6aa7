// Tests of troupe's TLS stream (JobTls) on real sockets: the records it seals itself after
// OpenSSL's handshake (tls_records.h) arrive whole and in order through reads of every shape,
// the keys change (KeyUpdate) and both ends follow, an altered byte is caught, and
// close_notify is the end of the stream.

#include <catch2/catch.hpp>

#include <kj/async-io.h>
#include <kj/debug.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "crypto_threads.h"
#include "forwarding_stream.h"
#include "secure.h"

namespace troupe {
namespace {

constexpr char kSecret[] = "tls_stream_test: a secret of more than thirty-two characters";

// The socket under one TLS end: counts the TLS records written through it once `counting` is
// set (every write of the stream holds whole records), and flips one byte of ciphertext at
// `flipAt` (counted from when counting began).
class WireTap final : public ForwardingStream {
 public:
  using ForwardingStream::ForwardingStream;
  bool counting = false;
  size_t records = 0, bytes = 0;
  kj::Maybe<size_t> flipAt;

  kj::Promise<void> write(const void* buffer, size_t size) override {
    auto data = kj::arrayPtr(static_cast<const kj::byte*>(buffer), size);
    if (!counting) return inner_->write(buffer, size);
    for (size_t at = 0; at + 5 <= size;) {
      ++records;
      at += 5 + (size_t(data[at + 3]) << 8 | data[at + 4]);
    }
    size_t begin = bytes;
    bytes += size;
    KJ_IF_MAYBE(flip, flipAt) {
      if (*flip >= begin && *flip < bytes) {
        auto copy = kj::heapArray<kj::byte>(data);
        copy[*flip - begin] ^= 0x20;
        auto sent = inner_->write(copy.begin(), copy.size());
        return sent.attach(kj::mv(copy));
      }
    }
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    KJ_ASSERT(pieces.size() == 1, "the TLS stream writes one buffer at a time");
    return write(pieces[0].begin(), pieces[0].size());
  }
  kj::Maybe<int> getFd() const override { return nullptr; }
};

struct Pair {
  // Two ends of a connection, on the thread's event loop (`shared`'s, or one of their own).
  kj::Own<kj::AsyncIoContext> own;
  kj::AsyncIoContext& io;
  JobTls tls{kSecret};
  WireTap* clientWire = nullptr;
  kj::Own<kj::AsyncIoStream> client, server;

  explicit Pair(uint64_t rekeyEvery = JobTls::kRecordsPerKey, kj::AsyncIoContext* shared = nullptr)
      : own(shared == nullptr ? kj::heap(kj::setupAsyncIo()) : kj::Own<kj::AsyncIoContext>()),
        io(shared == nullptr ? *own : *shared) {
    tls.rekeyEvery(rekeyEvery);
    auto pipe = io.provider->newTwoWayPipe();
    auto wire = kj::heap<WireTap>(kj::mv(pipe.ends[0]));
    clientWire = wire.get();
    auto accepted = tls.wrapServer(kj::mv(pipe.ends[1]));
    client = tls.wrapClient(kj::mv(wire)).wait(io.waitScope);
    server = accepted.wait(io.waitScope);
    clientWire->counting = true;
  }
};

kj::byte patternAt(uint64_t offset) {
  return static_cast<kj::byte>(offset * 2654435761u >> 13);
}

std::vector<kj::byte> pattern(uint64_t from, size_t size) {
  std::vector<kj::byte> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = patternAt(from + i);
  return out;
}

// Reads `total` bytes in reads of `readSize` bytes (the last may be shorter) and checks that
// each byte is the pattern's at its offset; resolves with the number of reads.
kj::Promise<size_t> readChecked(kj::AsyncIoStream& in, uint64_t total, size_t readSize,
                                std::shared_ptr<std::vector<kj::byte>> buffer = nullptr,
                                uint64_t got = 0, size_t reads = 0) {
  if (got == total) return reads;
  if (!buffer) buffer = std::make_shared<std::vector<kj::byte>>(readSize);
  size_t want = std::min<uint64_t>(readSize, total - got);
  return in.tryRead(buffer->data(), want, want)
      .then([&in, total, readSize, buffer, got, reads, want](size_t n) {
        KJ_ASSERT(n == want, "the stream ended early", got, n, total);
        for (size_t i = 0; i < n; ++i) {
          if ((*buffer)[i] != patternAt(got + i)) {
            KJ_FAIL_ASSERT("a byte arrived changed or out of order", got + i);
          }
        }
        return readChecked(in, total, readSize, buffer, got + n, reads + 1);
      });
}

// Waits for `writing` and then for `reading`; a read that fails first fails this at once (the
// writer would wait forever for a reader that stopped).
size_t transfer(kj::WaitScope& ws, kj::Promise<void> writing, kj::Promise<size_t> reading) {
  auto read = reading.fork();
  kj::Promise<void> readFailed =
      read.addBranch().then([](size_t) -> kj::Promise<void> { return kj::NEVER_DONE; });
  writing.exclusiveJoin(kj::mv(readFailed)).wait(ws);
  return read.addBranch().wait(ws);
}

struct SealingAt {
  // Where the test's large writes are sealed: on a crypto thread (as on a machine of
  // CryptoThreads::kSealElsewhereCpus CPUs or more) or on the event loop, whatever this one has.
  explicit SealingAt(bool elsewhere) { CryptoThreads::sealElsewhere(elsewhere); }
  ~SealingAt() { CryptoThreads::sealElsewhere(nullptr); }
};

TEST_CASE("TLS stream: writes of every size arrive whole through reads of every size", "[tls]") {
  bool elsewhere = GENERATE(false, true);
  INFO((elsewhere ? "large writes sealed on a crypto thread" : "sealed on the event loop"));
  SealingAt sealing(elsewhere);
  Pair pair;
  // Writes that end inside a record, on a record's edge, and past a write buffer (1 MiB), as one
  // buffer and as a gather of pieces; reads as Cap'n Proto's message stream makes them (a header
  // word, then a body) and smaller than a record.
  std::vector<size_t> sizes = {1, 7, 16383, 16384, 16385, 100000, (1 << 20) + 13, 3 << 20};
  uint64_t total = 0;
  for (auto s : sizes) total += s;
  for (size_t readSize : {size_t(8), size_t(5000), size_t(1 << 20), size_t(8 << 20)}) {
    INFO("reads of " << readSize << " bytes");
    std::vector<std::vector<kj::byte>> data;
    uint64_t offset = 0;
    for (auto size : sizes) {
      data.push_back(pattern(offset, size));
      offset += size;
    }
    kj::Promise<void> writing = kj::READY_NOW;
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto& d = data[i];
      writing = writing.then([&pair, &d, i]() {
        if (i % 2 == 0) return pair.client->write(d.data(), d.size());
        // Three pieces: a word, the middle, and the rest.
        size_t a = std::min<size_t>(8, d.size()), b = std::max(a, d.size() / 2);
        auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(
            {kj::arrayPtr(d.data(), a), kj::arrayPtr(d.data() + a, b - a),
             kj::arrayPtr(d.data() + b, d.size() - b)});
        auto written = pair.client->write(pieces);
        return written.attach(kj::mv(pieces));
      });
    }
    size_t reads = transfer(pair.io.waitScope, kj::mv(writing),
                            readChecked(*pair.server, total, readSize));
    CHECK(reads == (total + readSize - 1) / readSize);
  }
  // And the other way.
  auto back = pattern(0, 5 << 20);
  transfer(pair.io.waitScope, pair.server->write(back.data(), back.size()),
           readChecked(*pair.client, back.size(), 1 << 20));
}

TEST_CASE("TLS stream: the keys change every N records and both ends follow", "[tls]") {
  bool elsewhere = GENERATE(false, true);
  INFO((elsewhere ? "large writes sealed on a crypto thread" : "sealed on the event loop"));
  SealingAt sealing(elsewhere);
  uint64_t bytes = 4 << 20;  // 256 records of 16 KiB
  for (uint64_t every : {uint64_t(3), JobTls::kRecordsPerKey}) {
    INFO("a new key every " << every << " records");
    Pair pair(every);
    auto data = pattern(0, bytes);
    transfer(pair.io.waitScope, pair.client->write(data.data(), data.size()),
             readChecked(*pair.server, bytes, 1 << 20));
    // After each `every` records of data one more carries the KeyUpdate.
    size_t dataRecords = bytes / 16384;
    CHECK(pair.clientWire->records == dataRecords + dataRecords / every);
    // The server's side: its replies under keys the client must follow too.
    auto reply = pattern(0, 1 << 20);
    transfer(pair.io.waitScope, pair.server->write(reply.data(), reply.size()),
             readChecked(*pair.client, reply.size(), 4096));
  }
}

TEST_CASE("TLS stream: one altered byte of ciphertext fails the read, naming the check", "[tls]") {
  for (size_t flip : {size_t(3), size_t(700000)}) {  // a record's header; a byte of a payload
    INFO("byte " << flip << " after the handshake flipped");
    Pair pair;
    pair.clientWire->flipAt = flip;
    auto data = pattern(0, 1 << 20);
    auto reading = readChecked(*pair.server, data.size(), 1 << 20);
    auto writing = pair.client->write(data.data(), data.size());  // may never end: not waited for
    try {
      reading.wait(pair.io.waitScope);
      FAIL("the altered stream was read");
    } catch (const kj::Exception& e) {
      CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
      CHECK_THAT(e.getDescription().cStr(), Catch::Contains("TLS: ") &&
                                                (Catch::Contains("integrity check") ||
                                                 Catch::Contains("TLS 1.3 allows")));
    }
    // And it stays broken: a later read fails the same way, it does not return garbage.
    kj::byte more[16];
    CHECK_THROWS(pair.server->tryRead(more, 1, sizeof(more)).wait(pair.io.waitScope));
  }
}

TEST_CASE("TLS stream: close_notify ends the stream after every byte before it", "[tls]") {
  Pair pair;
  auto data = pattern(0, 100000);
  auto writing = pair.client->write(data.data(), data.size()).then([&pair]() {
    pair.client->shutdownWrite();
  });
  transfer(pair.io.waitScope, kj::mv(writing), readChecked(*pair.server, data.size(), 4096));
  kj::byte more[16];
  CHECK(pair.server->tryRead(more, 1, sizeof(more)).wait(pair.io.waitScope) == 0);
  CHECK(pair.clientWire->records == 7 + 1);  // 100000 bytes in 7 records, then the alert
}

TEST_CASE("TLS stream: a large read is opened on a crypto thread, each stream on its own",
          "[tls]") {
  // ctest runs each case in a process of its own, where no crypto thread has started yet.
  if (CryptoThreads::started() != 0) {
    WARN("skipped: an earlier case in this process started crypto threads; run this one alone");
    return;
  }
  auto data = pattern(0, 4 << 20);
  Pair first;
  Pair second(JobTls::kRecordsPerKey, &first.io);
  // Small reads (a message's header word, a small message) are opened on the event loop.
  transfer(first.io.waitScope, first.client->write(data.data(), 100000),
           readChecked(*first.server, 100000, 8));
  CHECK(CryptoThreads::started() == 0);
  // A batch-sized read hands its runs of records to a crypto thread; a second stream to another,
  // while the machine has CPUs for them.
  transfer(first.io.waitScope, first.client->write(data.data(), data.size()),
           readChecked(*first.server, data.size(), data.size()));
  CHECK(CryptoThreads::started() == 1);
  transfer(second.io.waitScope, second.client->write(data.data(), data.size()),
           readChecked(*second.server, data.size(), data.size()));
  size_t cpus = std::thread::hardware_concurrency();
  CHECK(CryptoThreads::started() == std::min<size_t>(2, cpus));
}

TEST_CASE("TLS stream: a peer without the job's secret is refused at the handshake", "[tls]") {
  auto io = kj::setupAsyncIo();
  JobTls ours(kSecret), theirs("tls_stream_test: another secret, also thirty-two characters");
  auto pipe = io.provider->newTwoWayPipe();
  auto accepted = ours.wrapServer(kj::mv(pipe.ends[1]));
  auto connected = theirs.wrapClient(kj::mv(pipe.ends[0]));
  CHECK_THROWS_WITH(connected.wait(io.waitScope), Catch::Contains("authentication failed"));
  CHECK_THROWS(accepted.wait(io.waitScope));
}

}  // namespace
}  // namespace troupe
