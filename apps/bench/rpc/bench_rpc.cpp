// bench_rpc: what one remote call costs on this stack, across two processes over TCP loopback.
//
// For each mode of the mode table the bench measures the round-trip time of sequential calls
// (p50/p99) and the throughput of pipelined calls with a window of calls in flight. Modes:
//   (a)  raw TCP ping-pong of the payload (TCP_NODELAY), one write and one read per message;
//   (b)  a Cap'n Proto call over plain TwoPartyVatNetwork (bench.capnp, no troupe runtime);
//   (b2) the same with troupe::CoalescingStream under the network on both ends;
//   (b3) the same over TLS 1.3 (troupe::JobTls, the key pair derived from a secret), the stack
//        troupe runs under every connection: RPC -> CoalescingStream -> TLS -> TCP;
//   (c)  a troupe actor call: a two-node cluster under `troupe sim` whose nodes are this binary
//        (`--troupe-node`); the driver, on the head, spawns an echo actor on the other node,
//        measures the same way and prints its figures on one line, which this process parses;
//   (c2) the same with a restart policy on the echo actor, whose reference is then a local
//        forwarding capability that can follow it to a new incarnation;
//   (c0) mode (c) with `--insecure` on both nodes: plaintext, what TLS costs a troupe call.
// Modes (a)-(b2) talk to a server child (this binary with `--serve`); to add such a mode, write a
// Caller and a serve function and add a row to kModes (the server dispatches on the mode's tag,
// sent as the first byte of a connection). A mode that runs in processes of its own, like (c),
// gives a `run` function instead. Every child is reaped on every path: the server exits when its
// stdin (the lifeline) closes; `troupe sim` gets SIGTERM when this process dies
// (PR_SET_PDEATHSIG) and cascades it to its nodes.
//
// Its parts: bench_rpc.h.

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/io.h>
#include <nlohmann/json.hpp>

#include "bench.capnp.h"
#include "coalescing_stream.h"
#include "secure.h"
#include "subprocess.h"
#include "troupe/troupe.h"

#include "bench_rpc.h"

namespace troupe::bench {
namespace {

// =============================================================================================
// Server process

struct Header {
  // First bytes of every connection.
  char tag;
  uint32_t payloadSize;
};

constexpr size_t kHeaderBytes = 5;

class Server final : private kj::TaskSet::ErrorHandler {
 public:
  explicit Server(kj::AsyncIoContext& io) : io(io), tasks(*this) {}

  kj::Promise<void> acceptLoop(kj::ConnectionReceiver& listener) {
    return listener.accept().then([this, &listener](kj::Own<kj::AsyncIoStream> connection) {
      setNoDelay(*connection);
      tasks.add(serveConnection(kj::mv(connection)));
      return acceptLoop(listener);
    });
  }

 private:
  kj::AsyncIoContext& io;
  kj::TaskSet tasks;

  kj::Promise<void> serveConnection(kj::Own<kj::AsyncIoStream> connection) {
    auto header = kj::heapArray<kj::byte>(kHeaderBytes);
    auto read = connection->read(header.begin(), header.size());
    return read.then([connection = kj::mv(connection), header = kj::mv(header)]() mutable {
      uint32_t payloadSize;
      memcpy(&payloadSize, header.begin() + 1, sizeof(payloadSize));
      auto mode = findMode(static_cast<char>(header[0]));
      KJ_REQUIRE(mode != nullptr, "unknown bench mode tag", header[0]);
      return mode->serve(kj::mv(connection), payloadSize);
    });
  }

  void taskFailed(kj::Exception&& exception) override {
    if (exception.getType() != kj::Exception::Type::DISCONNECTED) KJ_LOG(ERROR, exception);
  }
};

/// Runs the server: prints its port on stdout, serves until stdin (the lifeline to the parent)
/// reaches EOF.
int serve() {
  auto io = kj::setupAsyncIo();
  auto address = io.provider->getNetwork().parseAddress("127.0.0.1", 0).wait(io.waitScope);
  auto listener = address->listen();
  printf("%u\n", listener->getPort());
  fflush(stdout);

  Server server(io);
  auto lifeline = io.lowLevelProvider->wrapInputFd(STDIN_FILENO);
  auto parentGone = lifeline->readAllBytes().ignoreResult();
  parentGone.exclusiveJoin(server.acceptLoop(*listener)).wait(io.waitScope);
  return 0;
}

// =============================================================================================
// Client process

class ServerProcess {
  // The server child. The destructor always reaps it: it closes the lifeline (the child exits on
  // EOF), waits a little, then kills it.
 public:
  ServerProcess() {
    int lifeline[2], report[2];
    KJ_SYSCALL(pipe2(lifeline, O_CLOEXEC));
    KJ_SYSCALL(pipe2(report, O_CLOEXEC));
    lifelineFd = kj::AutoCloseFd(lifeline[1]);
    kj::AutoCloseFd lifelineRead(lifeline[0]);
    kj::AutoCloseFd reportWrite(report[1]);
    reportFd = kj::AutoCloseFd(report[0]);

    troupe::subprocess::Spec spec;
    spec.argv = {"bench_rpc", "--serve"};
    spec.program = "/proc/self/exe";
    spec.in = troupe::subprocess::Stream::of(lifeline[0]);
    spec.out = troupe::subprocess::Stream::of(report[1]);
    child = kj::heap<troupe::subprocess::Child>(spec);
  }

  ~ServerProcess() {
    lifelineFd = nullptr;              // it exits on EOF
    child->wait(std::chrono::seconds(3));  // then the Child kills and reaps it if it must
  }

  KJ_DISALLOW_COPY(ServerProcess);

  /// The port the server listens on, as it reported it (waits up to 10 s).
  uint readPort() {
    char line[32] = {};
    size_t used = 0;
    while (used < sizeof(line) - 1 && memchr(line, '\n', used) == nullptr) {
      struct pollfd pfd = {reportFd.get(), POLLIN, 0};
      int ready;
      KJ_SYSCALL(ready = poll(&pfd, 1, 10000));
      KJ_REQUIRE(ready > 0, "the bench server did not report its port within 10 s");
      ssize_t n;
      KJ_SYSCALL(n = read(reportFd.get(), line + used, sizeof(line) - 1 - used));
      KJ_REQUIRE(n > 0, "the bench server exited before reporting its port");
      used += n;
    }
    return static_cast<uint>(atoi(line));
  }

 private:
  kj::Own<troupe::subprocess::Child> child;
  kj::AutoCloseFd lifelineFd;
  kj::AutoCloseFd reportFd;
};

Figures measure(const Mode& mode, kj::AsyncIoContext& io, uint port, const Options& options) {
  auto address = io.provider->getNetwork().parseAddress("127.0.0.1", port).wait(io.waitScope);
  auto connection = address->connect().wait(io.waitScope);
  setNoDelay(*connection);
  kj::byte header[kHeaderBytes];
  header[0] = mode.tag;
  uint32_t payloadSize = options.payloadBytes;
  memcpy(header + 1, &payloadSize, sizeof(payloadSize));
  connection->write(header, sizeof(header)).wait(io.waitScope);
  if (mode.tls) connection = benchTls().wrapClient(kj::mv(connection)).wait(io.waitScope);

  Measurement measurement(mode.connect(kj::mv(connection), options.payloadBytes), options,
                          io.provider->getTimer());
  auto figures = measurement.run().wait(io.waitScope);
  figures.mode = &mode;
  return figures;
}

void printTable(const std::vector<Figures>& results, const Options& options) {
  printf(
      "bench_rpc: %zu-byte payload, %u sequential calls, best of %u rounds of %u pipelined "
      "calls per window\n\n",
      options.payloadBytes, options.sequentialCalls, options.rounds, options.pipelinedCalls);
  printf("%-26s %9s %9s", "mode", "p50 us", "p99 us");
  for (uint window : options.windows)
    printf("  %12s", ("calls/s w=" + std::to_string(window)).c_str());
  printf("  %8s %8s\n", "usr us", "sys us");
  for (auto& figures : results) {
    printf("%-26s %9.1f %9.1f", figures.mode->title, figures.p50Us, figures.p99Us);
    for (uint window : options.windows) printf("  %12.0f", figures.callsPerSecond.at(window));
    printf("  %8.2f %8.2f\n", figures.userUsPerCall, figures.systemUsPerCall);
  }
  printf(
      "\nusr/sys us: user and system CPU time of the calling process per call, at w=%u (for (c),\n"
      "the driver's node, on the head).\n",
      options.windows.back());
}

void printJson(const std::vector<Figures>& results, const Options& options) {
  nlohmann::json modes = nlohmann::json::object();
  for (auto& figures : results) {
    auto entry = figuresToJson(figures);
    entry["title"] = figures.mode->title;
    modes[figures.mode->key] = entry;
  }
  nlohmann::json out = {{"bench", "rpc"},
                        {"payload_bytes", options.payloadBytes},
                        {"sequential_calls", options.sequentialCalls},
                        {"pipelined_calls", options.pipelinedCalls},
                        {"rounds", options.rounds},
                        {"modes", modes}};
  printf("%s\n", out.dump().c_str());
}

int runClient(const Options& options, const std::vector<std::string>& only) {
  std::vector<const Mode*> selected;
  for (auto& mode : modes()) {
    if (only.empty() || std::find(only.begin(), only.end(), mode.key) != only.end()) {
      selected.push_back(&mode);
    }
  }
  bool needServer = std::any_of(selected.begin(), selected.end(),
                                [](const Mode* mode) { return mode->serve != nullptr; });
  // Before setupAsyncIo(): the child must not inherit KJ's signal state.
  auto server = needServer ? kj::heap<ServerProcess>() : kj::Own<ServerProcess>();
  uint port = needServer ? server->readPort() : 0;
  auto io = kj::setupAsyncIo();
  std::vector<Figures> results;
  for (auto* mode : selected) {
    if (mode->run != nullptr) {
      results.push_back(mode->run(options));
      results.back().mode = mode;
    } else {
      results.push_back(measure(*mode, io, port, options));
    }
  }
  if (options.json) {
    printJson(results, options);
  } else {
    printTable(results, options);
  }
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  using namespace troupe::bench;
  if (argc > 1 && strcmp(argv[1], kNodeFlag) == 0) return runTroupeNode(argc, argv);
  signal(SIGPIPE, SIG_IGN);

  Options options;
  bool serveMode = false;
  std::vector<std::string> only;
  CLI::App app{"Round trip and pipelined throughput of raw TCP, Cap'n Proto and troupe calls"};
  app.add_flag("--serve", serveMode, "run as the server process (internal)")->group("");
  app.add_flag("--json", options.json, "print one JSON object instead of a table");
  app.add_option("--payload", options.payloadBytes, "payload bytes per call")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--calls", options.sequentialCalls, "sequential calls for p50/p99")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--pipelined", options.pipelinedCalls, "calls per pipelined run")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--rounds", options.rounds, "pipelined rounds per window; the best is reported")
      ->check(CLI::Range(1, 100));
  app.add_option("--windows", options.windows, "calls in flight, one run per value")
      ->check(CLI::Range(1, 1000000));
  std::vector<std::string> keys;
  for (auto& mode : modes()) keys.push_back(mode.key);
  app.add_option("--modes", only, "modes to run; default all")->check(CLI::IsMember(keys));
  app.add_option("--troupe", options.troupeBinary, "the troupe binary, for `troupe sim` (mode c)");
  CLI11_PARSE(app, argc, argv);

  try {
    return serveMode ? serve() : runClient(options, only);
  } catch (const kj::Exception& exception) {
    fprintf(stderr, "bench_rpc: %s\n", kj::str(exception).cStr());
    return 1;
  }
}

