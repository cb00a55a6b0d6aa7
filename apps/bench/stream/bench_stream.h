// bench_stream's parts (bench_stream.cpp says what is measured, and runs the modes):
//   raw_modes.cpp    raw_tcp, raw_tls, and the cipher alone (the bounds)
//   capnp_mode.cpp   capnp, capnp_tls
//   troupe_mode.cpp  troupe, troupe_insecure, troupe_x2 (the actors, the driver, `troupe sim`),
//                    and grpc's child

#pragma once

#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/one-of.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stream.capnp.h"
#include "troupe/send_buffer.h"
#include "troupe/transport.h"

namespace troupe::bench {

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


nlohmann::json toJson(const Options& o);
Options fromJson(const nlohmann::json& j);

struct Result {
  std::string mode;
  uint64_t batchBytes = 0, batches = 0;
  double seconds = 0, producerCpu = 0, consumerCpu = 0;
  double consumerLoopCpu = -1;  // the troupe modes: the consumer's event-loop thread alone

  double mbPerSecond() const { return batches * batchBytes / 1e6 / seconds; }
  double cpuUsPerMb(double cpu) const { return cpu * 1e6 / (batches * batchBytes / 1e6); }
};

double cpuSeconds(int who);
double now();
uint64_t touch(kj::ArrayPtr<const kj::byte> data);
// Reads every 64th byte, as a consumer that uses the batch would touch each cache line.

transport::Tls& benchTls();
// Both ends derive the key pair from the same secret, as a job's nodes do.

// -- raw_modes.cpp

Result rawStream(uint64_t size, uint32_t batches, bool tls);
struct CipherCost {
  std::string suite;          // the TLS 1.3 suite two ends of a job agree on
  size_t recordBytes = 16384;  // the plaintext of a full record, as troupe seals a batch
  double sealUsPerMb = 0, openUsPerMb = 0;  // one thread's CPU per MB of plaintext
};
CipherCost measureCipher();

// -- capnp_mode.cpp

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
                          kj::Function<kj::Promise<void>()>& mayPush);
Result capnpStream(uint64_t size, uint32_t batches, bool tls);

// -- troupe_mode.cpp

std::vector<Result> runTroupe(Options options, const std::string& mode);
Result runGrpc(const Options& options, uint64_t size, uint32_t batches);
int runTroupeNode(int argc, char** argv);

}  // namespace troupe::bench
