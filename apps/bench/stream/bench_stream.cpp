// bench_stream: how fast batches move from a producer to a consumer in another process, the way
// hetero_train's augmenters feed its trainer, beside what the machine's loopback allows.
//
// For each batch size (default 64 KiB, 1 MiB, 4 MiB and 25.7 MB, the seeds' 8192 x 784 float32
// batch) each mode streams about --mib MiB and reports MB/s, batches/s and the CPU each side spends
// per MB (user + system). Modes, all in one run:
//   raw_tcp          one writer thread, one reader thread, a loopback TCP connection with 4 MiB
//                    socket buffers: the bound for anything over TCP here;
//   raw_tls          the same through TLS 1.3 as troupe configures it (the job's OpenSSL context:
//                    its certificate, its cipher order), with blocking SSL_write/SSL_read of
//                    1 MiB, reading ahead 1 MiB: what encryption alone leaves of raw_tcp, the
//                    bound for TLS here;
//   capnp            a Cap'n Proto `push(batch) -> stream` over a plain TwoPartyVatNetwork, the
//                    two ends on their own threads and event loops;
//   capnp_tls        the same under troupe's transport stack: CoalescingStream over TLS 1.3
//                    (troupe::JobTls) on both ends;
//   troupe_insecure  troupe's real path: under `troupe sim`, a Consumer actor on one node calls a
//                    Producer actor on the other directly, hands it a sink and grants a credit per
//                    batch it has read; the producer pushes at most --credits batches ahead (the
//                    shape of Augmenter.produce / grant); both nodes run with --insecure;
//   troupe           the same with TLS, troupe's default;
//   troupe_x2        the same with two producers on two nodes streaming into one consumer at
//                    once: aggregate ingest, each stream opened on its own crypto thread;
//   grpc             gRPC's plaintext server stream between two processes (bench_stream_grpc,
//                    grpc_stream.cpp), built where gRPC's C++ packages are
//                    (scripts/install-deps.sh --grpc); skipped, saying so, elsewhere.
// The troupe modes' nodes are this binary (`--troupe-node`); the driver prints its figures on one
// line, which this process parses. Every child is reaped: troupe::ChildProcess kills `troupe sim`
// if this process ends first, and the simulator cascades to its nodes.

#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <chrono>
#include <cstdio>
#include <future>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/one-of.h>
#include <limits.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "coalescing_stream.h"
#include "secure.h"
#include "stream.capnp.h"
#include "troupe/process.h"
#include "troupe/send_buffer.h"
#include "troupe/troupe.h"

namespace troupe::bench {
namespace {

constexpr char kNodeFlag[] = "--troupe-node";
constexpr char kFiguresMarker[] = "bench_stream figures: ";
constexpr uint64_t kSeedsBatch = 8192ull * 784 * 4;  // 25,690,112 bytes

struct Options {
  std::vector<uint64_t> sizes = {64 << 10, 1 << 20, 4 << 20, kSeedsBatch};
  uint64_t mib = 512;    // streamed per size and mode
  uint32_t credits = 4;  // hetero_train's --prefetch default
  uint32_t producers = 1;  // the troupe modes' data nodes (troupe_x2: 2)
  std::string cpuScale = "off";  // troupe sim's --cpu-scale for the troupe modes
  bool json = false;
  std::string troupeBinary = TROUPE_BINARY;
#ifdef TROUPE_BENCH_GRPC
  std::string grpcBinary = TROUPE_BENCH_GRPC;
#else
  std::string grpcBinary;
#endif

  uint32_t batchesFor(uint64_t size) const {
    return static_cast<uint32_t>(std::max<uint64_t>(4, (mib << 20) / size));
  }
};

nlohmann::json toJson(const Options& o) {
  return {{"sizes", o.sizes}, {"mib", o.mib}, {"credits", o.credits}, {"producers", o.producers}};
}
Options fromJson(const nlohmann::json& j) {
  Options o;
  o.sizes = j.at("sizes").get<std::vector<uint64_t>>();
  o.mib = j.at("mib").get<uint64_t>();
  o.credits = j.at("credits").get<uint32_t>();
  o.producers = j.at("producers").get<uint32_t>();
  return o;
}

struct Result {
  std::string mode;
  uint64_t batchBytes = 0, batches = 0;
  double seconds = 0, producerCpu = 0, consumerCpu = 0;
  double consumerLoopCpu = -1;  // the troupe modes: the consumer's event-loop thread alone

  double mbPerSecond() const { return batches * batchBytes / 1e6 / seconds; }
  double cpuUsPerMb(double cpu) const { return cpu * 1e6 / (batches * batchBytes / 1e6); }
};

double cpuSeconds(int who) {
  struct rusage u;
  getrusage(who, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Reads every 64th byte, as a consumer that uses the batch would touch each cache line.
uint64_t touch(kj::ArrayPtr<const kj::byte> data) {
  uint64_t sum = 0;
  for (size_t i = 0; i < data.size(); i += 64) sum += data[i];
  return sum;
}

// =============================================================================================
// raw_tcp, raw_tls

JobTls& benchTls() {
  // Both ends derive the key pair from the same secret, as a job's nodes do.
  static JobTls jobTls("bench_stream: the secret both ends derive their TLS key pair from");
  return jobTls;
}

// One end of a raw connection: a socket, and a TLS session on it for raw_tls.
struct RawEnd {
  int fd;
  SSL* ssl = nullptr;

  RawEnd(int fd, bool tls, bool server) : fd(fd) {
    if (!tls) return;
    ssl = SSL_new(benchTls().context());
    KJ_ASSERT(ssl != nullptr && SSL_set_fd(ssl, fd) == 1, "SSL_new");
    // Whole socket buffers per read, not a header and a record per syscall.
    SSL_set_read_ahead(ssl, 1);
    SSL_set_default_read_buffer_len(ssl, 1 << 20);
    if (!server) SSL_set_tlsext_host_name(ssl, JobTls::kPeerName);
    int ok = server ? SSL_accept(ssl) : SSL_connect(ssl);
    KJ_ASSERT(ok == 1, "TLS handshake failed", ERR_error_string(ERR_get_error(), nullptr));
  }
  ~RawEnd() {
    if (ssl != nullptr) SSL_free(ssl);
    close(fd);
  }
  ssize_t read(kj::byte* buffer, size_t size) {
    if (ssl == nullptr) return ::read(fd, buffer, size);
    size_t n = 0;
    return SSL_read_ex(ssl, buffer, size, &n) == 1 ? static_cast<ssize_t>(n) : -1;
  }
  ssize_t write(const kj::byte* buffer, size_t size) {
    if (ssl == nullptr) return ::write(fd, buffer, size);
    size_t n = 0;
    return SSL_write_ex(ssl, buffer, kj::min(size, size_t(1) << 20), &n) == 1
               ? static_cast<ssize_t>(n)
               : -1;
  }
};

Result rawStream(uint64_t size, uint32_t batches, bool tls) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  KJ_SYSCALL(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  socklen_t len = sizeof(addr);
  KJ_SYSCALL(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len));
  KJ_SYSCALL(listen(listener, 1));
  int big = 4 << 20;
  uint64_t total = size * batches;
  Result r{tls ? "raw_tls" : "raw_tcp", size, batches};
  std::atomic<double> start{0};
  std::thread reader([&] {
    int fd = accept(listener, nullptr, nullptr);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    RawEnd end(fd, tls, true);
    std::vector<kj::byte> buffer(1 << 20);
    uint64_t got = 0, sum = 0;
    double cpu0 = 0;
    while (got < total) {
      ssize_t n = end.read(buffer.data(), buffer.size());
      if (n <= 0) break;
      if (got == 0) cpu0 = cpuSeconds(RUSAGE_THREAD);  // after the handshake
      sum += touch(kj::arrayPtr(buffer.data(), n));
      got += n;
    }
    r.seconds = now() - start;
    r.consumerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    KJ_ASSERT(got == total, "raw stream lost bytes", r.mode, got, total, sum);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  KJ_SYSCALL(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  {
    RawEnd end(fd, tls, false);
    std::vector<kj::byte> batch(size, 'x');
    start = now();
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    for (uint32_t b = 0; b < batches; ++b) {
      for (size_t off = 0; off < size;) {
        ssize_t n = end.write(batch.data() + off, size - off);
        KJ_ASSERT(n > 0, "raw write failed", r.mode, strerror(errno));
        off += n;
      }
    }
    r.producerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    reader.join();
  }
  close(listener);
  return r;
}

// =============================================================================================
// The cipher alone: the bound's other half

struct CipherCost {
  std::string suite;          // the TLS 1.3 suite two ends of a job agree on
  size_t recordBytes = 16384;  // the plaintext of a full record, as troupe seals a batch
  double sealUsPerMb = 0, openUsPerMb = 0;  // one thread's CPU per MB of plaintext
};

// The suite a handshake between two ends of benchTls() agrees on (over a BIO pair, in memory).
std::string negotiatedSuite() {
  SSL* client = SSL_new(benchTls().context());
  SSL* server = SSL_new(benchTls().context());
  KJ_ASSERT(client != nullptr && server != nullptr, "SSL_new");
  BIO *a = nullptr, *b = nullptr;
  KJ_ASSERT(BIO_new_bio_pair(&a, 0, &b, 0) == 1, "BIO_new_bio_pair");
  SSL_set_bio(client, a, a);
  SSL_set_bio(server, b, b);
  SSL_set_tlsext_host_name(client, JobTls::kPeerName);
  SSL_set_connect_state(client);
  SSL_set_accept_state(server);
  for (int turn = 0; turn < 20 && !(SSL_is_init_finished(client) && SSL_is_init_finished(server));
       ++turn) {
    SSL_do_handshake(client);
    SSL_do_handshake(server);
  }
  KJ_ASSERT(SSL_is_init_finished(client), "the in-memory handshake did not finish");
  std::string suite = SSL_CIPHER_standard_name(SSL_get_current_cipher(client));
  SSL_free(client);
  SSL_free(server);
  return suite;
}

const EVP_CIPHER* aeadOf(const std::string& suite) {
  if (suite == "TLS_AES_128_GCM_SHA256") return EVP_aes_128_gcm();
  if (suite == "TLS_AES_256_GCM_SHA384") return EVP_aes_256_gcm();
  if (suite == "TLS_CHACHA20_POLY1305_SHA256") return EVP_chacha20_poly1305();
  KJ_FAIL_REQUIRE("a suite bench_stream does not know", suite);
}

// Seals 256 MiB of plaintext as records of `recordBytes` (a nonce per record, the 5-byte header
// as associated data, the tag after the ciphertext, out of place as a sender fills its socket
// buffer), then opens them again; CPU time of this thread per MB for each.
CipherCost measureCipher() {
  CipherCost c;
  c.suite = negotiatedSuite();
  const EVP_CIPHER* cipher = aeadOf(c.suite);
  constexpr size_t kBuffer = 4 << 20, kRounds = 64;
  size_t records = kBuffer / c.recordBytes, sealedBytes = c.recordBytes + 5 + 1 + 16;
  std::vector<kj::byte> plain(kBuffer + 64, 'x'), sealed(records * sealedBytes);
  kj::byte key[32] = {1}, iv[12] = {2}, header[5] = {23, 3, 3, 0, 0};
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  KJ_ASSERT(EVP_CipherInit_ex(ctx, cipher, nullptr, key, iv, 1) == 1, "EVP_CipherInit_ex");
  int n = 0;
  for (bool seal : {true, false}) {
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    for (size_t round = 0; round < kRounds; ++round) {
      for (size_t r = 0; r < records; ++r) {
        iv[11] = static_cast<kj::byte>(r);  // a new nonce per record, as the sequence number is
        kj::byte* record = sealed.data() + r * sealedBytes;
        kj::byte* text = plain.data() + r * c.recordBytes;
        kj::byte* tag = record + sealedBytes - 16;
        KJ_ASSERT(EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, iv, seal) == 1);
        EVP_CipherUpdate(ctx, nullptr, &n, header, sizeof(header));
        if (seal) {
          EVP_CipherUpdate(ctx, record, &n, text, c.recordBytes + 1);  // + the content type
          KJ_ASSERT(EVP_CipherFinal_ex(ctx, tag, &n) == 1);
          EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag);
        } else {
          EVP_CipherUpdate(ctx, text, &n, record, c.recordBytes + 1);
          EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag);
          KJ_ASSERT(EVP_CipherFinal_ex(ctx, text + c.recordBytes + 1, &n) == 1,
                    "a record failed to open", r);
        }
      }
    }
    double us = (cpuSeconds(RUSAGE_THREAD) - cpu0) * 1e6 / (kRounds * records * c.recordBytes / 1e6);
    (seal ? c.sealUsPerMb : c.openUsPerMb) = us;
  }
  EVP_CIPHER_CTX_free(ctx);
  return c;
}

// =============================================================================================
// capnp, capnp_tls

class SinkServer final : public Sink::Server {
  // Counts and touches what arrives; `onBatch` runs after each batch (a credit, for the troupe
  // modes); `whenAll` resolves once `expected` batches arrived.
 public:
  explicit SinkServer(
      uint64_t expected, kj::Function<void()> onBatch = [] {})
      : expected_(expected), onBatch_(kj::mv(onBatch)) {
    auto paf = kj::newPromiseAndFulfiller<void>();
    all_ = paf.promise.fork();
    fulfiller_ = kj::mv(paf.fulfiller);
  }
  ~SinkServer() noexcept(false) {
    if (fulfiller_->isWaiting()) {
      fulfiller_->reject(KJ_EXCEPTION(FAILED, kj::str("the sink was released after ", batches_,
                                                      " of ", expected_, " batches")));
    }
  }
  kj::Promise<void> whenAll() { return all_.addBranch(); }

  kj::Promise<void> push(PushContext context) override {
    auto batch = context.getParams().getBatch();
    checksum_ += touch(batch);
    bytes_ += batch.size();
    ++batches_;
    onBatch_();
    if (batches_ == expected_) fulfiller_->fulfill();
    return kj::READY_NOW;
  }
  kj::Promise<void> done(DoneContext context) override {
    auto r = context.getResults();
    r.setBatches(batches_);
    r.setBytes(bytes_);
    r.setChecksum(checksum_);
    return kj::READY_NOW;
  }

 private:
  uint64_t expected_, batches_ = 0, bytes_ = 0, checksum_ = 0;
  kj::Function<void()> onBatch_;
  kj::ForkedPromise<void> all_ = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> fulfiller_;
};

// Pushes `left` batches into `sink`, one after the other as flow control allows. Each batch is
// `batch`'s bytes: lent to the message when `batch` is a SendBuffer (the troupe modes: no copy,
// as raw_tcp's writer sends its buffer), else copied into it (the capnp modes, whose plain
// TwoPartyVatNetwork cannot hold a lent buffer until it is written).
using BatchBytes = kj::OneOf<kj::ArrayPtr<const kj::byte>, SendBuffer>;
kj::Promise<void> pushAll(Sink::Client sink, const BatchBytes& batch, uint32_t left,
                          kj::Function<kj::Promise<void>()>& mayPush) {
  if (left == 0) return kj::READY_NOW;
  return mayPush().then([sink, &batch, left, &mayPush]() mutable {
    auto request = sink.pushRequest();
    KJ_SWITCH_ONEOF(batch) {
      KJ_CASE_ONEOF(lent, SendBuffer) {
        request.adoptBatch(lent.lend(request));
      }
      KJ_CASE_ONEOF(pattern, kj::ArrayPtr<const kj::byte>) {
        memcpy(request.initBatch(pattern.size()).begin(), pattern.begin(), pattern.size());
      }
    }
    return request.send().then([sink, &batch, left, &mayPush]() mutable {
      return pushAll(kj::mv(sink), batch, left - 1, mayPush);
    });
  });
}

kj::Own<kj::AsyncIoStream> transport(kj::Own<kj::AsyncIoStream> socket, bool tls, bool server,
                                     kj::WaitScope& waitScope) {
  if (!tls) return socket;
  auto secure =
      server ? benchTls().wrapServer(kj::mv(socket)) : benchTls().wrapClient(kj::mv(socket));
  return kj::heap<CoalescingStream>(secure.wait(waitScope));
}

Result capnpStream(uint64_t size, uint32_t batches, bool tls) {
  Result r{tls ? "capnp_tls" : "capnp", size, batches};
  capnp::ReaderOptions reader;
  reader.traversalLimitInWords = (size + (1 << 20)) / 8 + (1 << 20);
  std::promise<int> port;
  std::thread server([&]() {
    auto io = kj::setupAsyncIo();
    auto listener =
        io.provider->getNetwork().parseAddress("127.0.0.1", 0).wait(io.waitScope)->listen();
    port.set_value(listener->getPort());
    auto stream = transport(listener->accept().wait(io.waitScope), tls, true, io.waitScope);
    auto sink = kj::heap<SinkServer>(batches);
    auto& counted = *sink;
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::SERVER, reader);
    auto rpc = capnp::makeRpcServer(network, kj::mv(sink));
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    counted.whenAll().wait(io.waitScope);
    r.consumerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    network.onDisconnect().wait(io.waitScope);
  });
  {
    auto io = kj::setupAsyncIo();
    auto address = io.provider->getNetwork()
                       .parseAddress("127.0.0.1", port.get_future().get())
                       .wait(io.waitScope);
    auto stream = transport(address->connect().wait(io.waitScope), tls, false, io.waitScope);
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::CLIENT, reader);
    auto rpc = capnp::makeRpcClient(network);
    capnp::MallocMessageBuilder vat;
    auto id = vat.initRoot<capnp::rpc::twoparty::VatId>();
    id.setSide(capnp::rpc::twoparty::Side::SERVER);
    auto sink = rpc.bootstrap(id).castAs<Sink>();
    std::vector<kj::byte> pattern(size, 'x');
    BatchBytes batch = kj::arrayPtr(pattern.data(), size).asConst();
    kj::Function<kj::Promise<void>()> always = [] { return kj::Promise<void>(kj::READY_NOW); };
    double start = now();
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    pushAll(sink, batch, batches, always).wait(io.waitScope);
    auto done = sink.doneRequest().send().wait(io.waitScope);
    r.seconds = now() - start;
    r.producerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    KJ_ASSERT(done.getBatches() == batches && done.getBytes() == size * batches,
              "the sink did not get every batch", done.getBatches(), done.getBytes());
  }
  server.join();
  return r;
}

// =============================================================================================
// troupe, troupe_insecure: the actors, the driver, and running them under `troupe sim`

class ProducerActor final : public ActorBase<Producer> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> produce(ProduceContext context) override {
    auto p = context.getParams();
    credits_ = p.getCredits();
    auto batch = SendBuffer::allocate(p.getBatchBytes());
    memset(batch.bytes().begin(), 'x', batch.size());
    batch_ = kj::mv(batch);
    mayPush_ = [this]() -> kj::Promise<void> {
      if (credits_ > 0) {
        --credits_;
        return kj::READY_NOW;
      }
      auto paf = kj::newPromiseAndFulfiller<void>();
      waiting_ = kj::mv(paf.fulfiller);
      return paf.promise.then([this]() { --credits_; });
    };
    double cpu0 = cpuSeconds(RUSAGE_SELF);
    return pushAll(p.getSink(), batch_, p.getBatches(), mayPush_).then([context, cpu0]() mutable {
      context.getResults().setCpuSeconds(cpuSeconds(RUSAGE_SELF) - cpu0);
    });
  }

  kj::Promise<void> grant(GrantContext context) override {
    credits_ += context.getParams().getCredits();
    KJ_IF_MAYBE(w, waiting_) {
      auto fulfiller = kj::mv(*w);
      waiting_ = nullptr;
      fulfiller->fulfill();
    }
    return kj::READY_NOW;
  }

 private:
  uint32_t credits_ = 0;
  BatchBytes batch_;  // lent to every push
  kj::Function<kj::Promise<void>()> mayPush_;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiting_;
};

class ConsumerActor final : public ActorBase<Consumer> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> pull(PullContext context) override {
    auto p = context.getParams();
    auto addresses = p.getProducers();
    uint32_t each = p.getBatches() / addresses.size();
    uint64_t size = p.getBatchBytes();
    // Per producer: its produce() call's answer, then every batch it sent arrived. The answer
    // first, so that a call that failed is reported with its own reason, not as the sink it
    // released early.
    auto producersDone = kj::heapArrayBuilder<kj::Promise<double>>(addresses.size());
    double start = now(), cpu0 = cpuSeconds(RUSAGE_SELF), loop0 = cpuSeconds(RUSAGE_THREAD);
    for (auto address : addresses) {
      auto producer = this->context().resolve<Producer>(ActorAddress::fromProto(address));
      auto sink = kj::heap<SinkServer>(each, [producer]() mutable {
        auto grant = producer.grantRequest();
        grant.setCredits(1);
        grant.send().detach([](kj::Exception&&) {});
      });
      auto arrived = sink->whenAll();
      auto request = producer.produceRequest();
      request.setSink(kj::mv(sink));
      request.setBatches(each);
      request.setBatchBytes(size);
      request.setCredits(p.getCredits());
      producersDone.add(request.send().then([arrived = kj::mv(arrived)](auto r) mutable {
        double cpu = r.getCpuSeconds();
        return arrived.then([cpu]() { return cpu; });
      }));
    }
    uint64_t batches = uint64_t(each) * addresses.size();
    return kj::joinPromises(producersDone.finish())
        .then([context, start, cpu0, loop0, batches, size](kj::Array<double> cpus) mutable {
          auto f = context.getResults().initFigures();
          f.setSeconds(now() - start);
          f.setConsumerCpuSeconds(cpuSeconds(RUSAGE_SELF) - cpu0);
          f.setConsumerLoopCpuSeconds(cpuSeconds(RUSAGE_THREAD) - loop0);
          double producers = 0;
          for (double c : cpus) producers += c;
          f.setProducerCpuSeconds(producers);
          f.setBatches(batches);
          f.setBytes(batches * size);
        });
  }
};

kj::Promise<void> measureSizes(Driver& job, std::shared_ptr<std::vector<Ref<Producer>>> producers,
                               Ref<Consumer> consumer,
                               std::shared_ptr<Options> options, size_t index,
                               std::shared_ptr<nlohmann::json> out) {
  if (index == options->sizes.size()) {
    printf("%s%s\n", kFiguresMarker, out->dump().c_str());
    fflush(stdout);
    return kj::READY_NOW;
  }
  uint64_t size = options->sizes[index];
  auto pull = consumer.pullRequest();
  auto addresses = pull.initProducers(producers->size());
  for (size_t i = 0; i < producers->size(); ++i) (*producers)[i].address().toProto(addresses[i]);
  pull.setBatches(options->batchesFor(size));
  pull.setBatchBytes(size);
  pull.setCredits(options->credits);
  return pull.send().then([=, &job](auto response) mutable {
    auto f = response.getFigures();
    out->push_back({{"batch_bytes", size},
                    {"batches", f.getBatches()},
                    {"seconds", f.getSeconds()},
                    {"producer_cpu", f.getProducerCpuSeconds()},
                    {"consumer_cpu", f.getConsumerCpuSeconds()},
                    {"consumer_loop_cpu", f.getConsumerLoopCpuSeconds()}});
    return measureSizes(job, producers, consumer, options, index + 1, out);
  });
}

kj::Promise<void> drive(Driver& job) {
  auto& args = job.args();
  auto flag = std::find(args.begin(), args.end(), kNodeFlag);
  KJ_REQUIRE(flag != args.end() && flag + 1 != args.end(), "no options after --troupe-node");
  auto options = std::make_shared<Options>(fromJson(nlohmann::json::parse(*(flag + 1))));
  auto producers = std::make_shared<std::vector<Ref<Producer>>>();  // one on each node of a
  for (auto& p : job.spawnEach<Producer>(Placement::group("a"))) producers->push_back(kj::mv(p));
  auto consumer = job.spawn<Consumer>(Placement::group("b"));
  return measureSizes(job, producers, consumer, options, 0,
                      std::make_shared<nlohmann::json>(nlohmann::json::array()));
}

std::string selfPath() {
  char path[PATH_MAX];
  ssize_t n;
  KJ_SYSCALL(n = readlink("/proc/self/exe", path, sizeof(path) - 1));
  return std::string(path, n);
}

std::vector<Result> runTroupe(Options options, const std::string& mode) {
  bool insecure = mode == "troupe_insecure";
  options.producers = mode == "troupe_x2" ? 2 : 1;
  KJ_REQUIRE(
      access(options.troupeBinary.c_str(), X_OK) == 0,
      "the troupe modes need the troupe binary (build the `troupe` target, or pass --troupe)",
      options.troupeBinary);
  EventLoop loop(1);
  ChildProcess::Options child;
  child.args = {options.troupeBinary, "sim"};
  if (insecure) {  // --env first: it takes every value up to the next flag
    for (auto env : {"a:TROUPE_INSECURE=1", "b:TROUPE_INSECURE=1"}) {
      child.args.push_back("--env");
      child.args.push_back(env);
    }
  }
  // The largest batch must fit in a message, with room for the call around it.
  uint64_t largest = *std::max_element(options.sizes.begin(), options.sizes.end());
  auto maxMessage = std::to_string(std::max<uint64_t>(64ull << 20, largest + (1 << 20)));
  for (auto arg : {std::string("--group"), "a=" + std::to_string(options.producers),
                   std::string("--group"), std::string("b=1"), std::string("--head-group"),
                   std::string("a"), std::string("--cpu-scale"), options.cpuScale}) {
    child.args.push_back(arg);
  }
  for (auto& arg :
       {selfPath(), std::string(kNodeFlag), toJson(options).dump(), std::string("--log-level"),
        std::string("warn"), std::string("--max-message-bytes"), maxMessage}) {
    child.args.push_back(arg);
  }
  std::string figures, output;
  child.onLine = [&](kj::StringPtr line, bool) {
    std::string text = line.cStr();
    auto at = text.find(kFiguresMarker);
    if (at != std::string::npos) figures = text.substr(at + strlen(kFiguresMarker));
    output += text + "\n";
  };
  ChildProcess sim(loop, kj::mv(child));
  auto exit = sim.onExit().wait(loop.waitScope());
  KJ_REQUIRE(exit.status == 0 && exit.signal == 0 && !figures.empty(), "the troupe cluster failed",
             exit.status, exit.signal, output);
  std::vector<Result> results;
  for (auto& f : nlohmann::json::parse(figures)) {
    Result r{mode, f.at("batch_bytes").get<uint64_t>(),
             f.at("batches").get<uint64_t>()};
    r.seconds = f.at("seconds").get<double>();
    r.producerCpu = f.at("producer_cpu").get<double>();
    r.consumerCpu = f.at("consumer_cpu").get<double>();
    r.consumerLoopCpu = f.at("consumer_loop_cpu").get<double>();
    results.push_back(r);
  }
  return results;
}

// grpc: bench_stream_grpc, one run per batch size; it prints one JSON object.
Result runGrpc(const Options& options, uint64_t size, uint32_t batches) {
  EventLoop loop(1);
  ChildProcess::Options child;
  child.args = {options.grpcBinary, std::to_string(size), std::to_string(batches)};
  std::string figures, output;
  child.onLine = [&](kj::StringPtr line, bool) {
    std::string text = line.cStr();
    if (!text.empty() && text[0] == '{') figures = text;
    output += text + "\n";
  };
  ChildProcess grpc(loop, kj::mv(child));
  auto exit = grpc.onExit().wait(loop.waitScope());
  KJ_REQUIRE(exit.status == 0 && exit.signal == 0 && !figures.empty(), "the gRPC stream failed",
             exit.status, exit.signal, output);
  auto f = nlohmann::json::parse(figures);
  Result r{"grpc", size, f.at("batches").get<uint64_t>()};
  r.seconds = f.at("seconds").get<double>();
  r.producerCpu = f.at("producer_cpu").get<double>();
  r.consumerCpu = f.at("consumer_cpu").get<double>();
  return r;
}

int runTroupeNode(int argc, char** argv) {
  Registry types;
  types.add<ProducerActor>();  // "stream.Producer"
  types.add<ConsumerActor>();  // "stream.Consumer"
  return troupe::run(argc, argv, types, drive);
}

// =============================================================================================
// Output

bool encrypted(const std::string& mode) {
  return mode == "raw_tls" || mode == "capnp_tls" || mode == "troupe" || mode == "troupe_x2";
}

struct Bounds {
  // Per batch size, from the raw_tcp row of the same size and the cipher alone: what TCP plus
  // the AEAD allow, each end on one core.
  double tcp = 0;     // raw_tcp's MB/s
  double tcpAes = 0;  // 1e6 / max(producer us/MB + seal us/MB, consumer us/MB + open us/MB)
};

Bounds boundsFor(const std::vector<Result>& results, uint64_t batchBytes,
                 const kj::Maybe<CipherCost>& cipher) {
  Bounds b;
  for (auto& r : results) {
    if (r.mode != "raw_tcp" || r.batchBytes != batchBytes) continue;
    b.tcp = r.mbPerSecond();
    KJ_IF_MAYBE(c, cipher) {
      double producer = r.cpuUsPerMb(r.producerCpu) + c->sealUsPerMb;
      double consumer = r.cpuUsPerMb(r.consumerCpu) + c->openUsPerMb;
      b.tcpAes = 1e6 / std::max(producer, consumer);
    }
  }
  return b;
}

// Why a mode asked for did not run (one line), or "".
std::string skipped(const Options& options, const std::vector<std::string>& modes) {
  if (std::count(modes.begin(), modes.end(), "grpc") > 0 && options.grpcBinary.empty()) {
    return "grpc: skipped: bench_stream_grpc was not built (no gRPC C++ packages: "
           "scripts/install-deps.sh --grpc, then configure again)";
  }
  return "";
}

void printTable(const std::vector<Result>& results, const Options& options,
                const kj::Maybe<CipherCost>& cipher, const std::string& skip) {
  printf("bench_stream: about %llu MiB per batch size and mode, %u credits\n",
         static_cast<unsigned long long>(options.mib), options.credits);
  if (!skip.empty()) printf("%s\n", skip.c_str());
  KJ_IF_MAYBE(c, cipher) {
    printf("the cipher alone (%s, %zu-byte records, one core): seal %.0f us/MB (%.0f MB/s), "
           "open %.0f us/MB (%.0f MB/s)\n",
           c->suite.c_str(), c->recordBytes, c->sealUsPerMb, 1e6 / c->sealUsPerMb,
           c->openUsPerMb, 1e6 / c->openUsPerMb);
  }
  printf("\n%12s  %-16s %10s %10s %9s %10s %14s %14s %10s\n", "batch bytes", "mode", "MB/s",
         "batches/s", "x raw TCP", "x TCP+AES", "producer us/MB", "consumer us/MB", "its loop");
  for (auto& r : results) {
    auto b = boundsFor(results, r.batchBytes, cipher);
    char againstAes[16] = "";
    if (encrypted(r.mode) && b.tcpAes > 0) {
      snprintf(againstAes, sizeof(againstAes), "%.2f", r.mbPerSecond() / b.tcpAes);
    }
    char loop[16] = "";
    if (r.consumerLoopCpu >= 0) snprintf(loop, sizeof(loop), "%.0f", r.cpuUsPerMb(r.consumerLoopCpu));
    printf("%12llu  %-16s %10.0f %10.1f %9.2f %10s %14.0f %14.0f %10s\n",
           static_cast<unsigned long long>(r.batchBytes), r.mode.c_str(), r.mbPerSecond(),
           r.batches / r.seconds, b.tcp > 0 ? r.mbPerSecond() / b.tcp : 0.0, againstAes,
           r.cpuUsPerMb(r.producerCpu), r.cpuUsPerMb(r.consumerCpu), loop);
  }
  printf(
      "\nus/MB: CPU time (user + system) per MB streamed: the thread of each end for raw_* and "
      "capnp*, the\nwhole node process of each actor for troupe* (troupe_x2: both producers' "
      "per MB of the two streams)\nand of each end for grpc; its loop: the consumer's event-loop "
      "thread alone, the rest "
      "is its crypto threads. MB = 10^6 bytes. x TCP+AES: "
      "against 1e6 / max(raw_tcp's\nproducer us/MB + seal, raw_tcp's consumer us/MB + open) of "
      "the same batch size, the bound for\nan encrypted stream with one core per end.\n");
}

void printJson(const std::vector<Result>& results, const Options& options,
               const kj::Maybe<CipherCost>& cipher, const std::string& skip) {
  nlohmann::json rows = nlohmann::json::array();
  for (auto& r : results) {
    auto b = boundsFor(results, r.batchBytes, cipher);
    nlohmann::json row = {{"mode", r.mode},
                          {"batch_bytes", r.batchBytes},
                          {"batches", r.batches},
                          {"seconds", r.seconds},
                          {"mb_per_second", r.mbPerSecond()},
                          {"batches_per_second", r.batches / r.seconds},
                          {"producer_cpu_us_per_mb", r.cpuUsPerMb(r.producerCpu)},
                          {"consumer_cpu_us_per_mb", r.cpuUsPerMb(r.consumerCpu)}};
    if (r.consumerLoopCpu >= 0) row["consumer_loop_cpu_us_per_mb"] = r.cpuUsPerMb(r.consumerLoopCpu);
    if (b.tcp > 0) row["x_raw_tcp"] = r.mbPerSecond() / b.tcp;
    if (encrypted(r.mode) && b.tcpAes > 0) {
      row["tcp_aes_bound_mb_per_second"] = b.tcpAes;
      row["x_tcp_aes"] = r.mbPerSecond() / b.tcpAes;
    }
    rows.push_back(row);
  }
  nlohmann::json out = {
      {"bench", "stream"}, {"mib", options.mib}, {"credits", options.credits}, {"results", rows}};
  if (!skip.empty()) out["skipped"] = skip;
  KJ_IF_MAYBE(c, cipher) {
    out["cipher"] = {{"suite", c->suite},
                     {"record_bytes", c->recordBytes},
                     {"seal_us_per_mb", c->sealUsPerMb},
                     {"open_us_per_mb", c->openUsPerMb}};
  }
  printf("%s\n", out.dump().c_str());
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  using namespace troupe::bench;
  if (argc > 1 && strcmp(argv[1], kNodeFlag) == 0) return runTroupeNode(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  Options options;
  std::vector<std::string> modes = {"raw_tcp",         "raw_tls", "capnp",     "capnp_tls",
                                    "troupe_insecure", "troupe",  "troupe_x2", "grpc"};
  std::vector<std::string> all = modes;
  CLI::App app{"Batches streamed between two processes: raw TCP, Cap'n Proto, troupe actors, gRPC"};
  app.add_flag("--json", options.json, "print one JSON object instead of a table");
  app.add_option("--sizes", options.sizes, "batch sizes in bytes")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  app.add_option("--mib", options.mib, "MiB streamed per batch size and mode")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--credits", options.credits, "batches a troupe producer may push ahead")
      ->check(CLI::Range(1, 1024));
  app.add_option("--modes", modes, "modes to run; default all")->check(CLI::IsMember(all));
  app.add_option("--troupe", options.troupeBinary, "the troupe binary, for `troupe sim`");
  app.add_option("--grpc", options.grpcBinary, "bench_stream_grpc, for the grpc mode");
  app.add_option("--cpu-scale", options.cpuScale,
                 "troupe sim's --cpu-scale for the troupe modes: off (default: every node may use "
                 "every CPU, as the raw modes' threads may), auto, or CPUS per vCPU");
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<Result> results;
    auto wanted = [&](const char* m) { return std::count(modes.begin(), modes.end(), m) > 0; };
    for (auto size : options.sizes) {
      uint32_t batches = options.batchesFor(size);
      if (wanted("raw_tcp")) results.push_back(rawStream(size, batches, false));
      if (wanted("raw_tls")) results.push_back(rawStream(size, batches, true));
      if (wanted("capnp")) results.push_back(capnpStream(size, batches, false));
      if (wanted("capnp_tls")) results.push_back(capnpStream(size, batches, true));
      if (wanted("grpc") && !options.grpcBinary.empty()) {
        results.push_back(runGrpc(options, size, batches));
      }
    }
    for (auto mode : {"troupe_insecure", "troupe", "troupe_x2"}) {
      if (!wanted(mode)) continue;
      for (auto& r : runTroupe(options, mode)) results.push_back(r);
    }
    kj::Maybe<CipherCost> cipher;
    if (std::any_of(modes.begin(), modes.end(), encrypted)) cipher = measureCipher();
    std::stable_sort(results.begin(), results.end(),
                     [](const Result& a, const Result& b) { return a.batchBytes < b.batchBytes; });
    auto skip = skipped(options, modes);
    if (options.json) {
      printJson(results, options, cipher, skip);
    } else {
      printTable(results, options, cipher, skip);
    }
    return 0;
  } catch (const kj::Exception& e) {
    fprintf(stderr, "bench_stream: %s\n", kj::str(e).cStr());
    return 1;
  }
}
