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
//   capnp_tls        the same under troupe's transport stack: its coalescing stream over TLS 1.3
//                    (troupe/transport.h) on both ends;
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
//
// Its parts: bench_stream.h.

#include <signal.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_stream.h"

namespace troupe::bench {

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

namespace {

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

