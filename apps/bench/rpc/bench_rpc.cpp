// bench_rpc: what one remote call costs on this stack, across two processes over TCP loopback.
//
// For each mode of the mode table the bench measures the round-trip time of sequential calls
// (p50/p99) and the throughput of pipelined calls with a window of calls in flight. Modes:
//   (a)  raw TCP ping-pong of the payload (TCP_NODELAY), one write and one read per message;
//   (b)  a Cap'n Proto call over plain TwoPartyVatNetwork (bench.capnp, no troupe runtime);
//   (b2) the same with troupe's coalescing stream under the network on both ends;
//   (b3) the same over TLS 1.3 (the key pair derived from a secret), the stack troupe runs under
//        every connection: RPC -> coalescing stream -> TLS -> TCP (troupe/transport.h);
//   (c)  a troupe actor call: a two-node cluster under `troupe sim` whose nodes are this binary
//        (`--troupe-node`); the driver, on the head, spawns an echo actor on the other node,
//        measures the same way and prints its figures on one line, which this process parses;
//   (c2) the same with a restart policy on the echo actor, whose reference is then a local
//        forwarding capability that can follow it to a new incarnation;
//   (c0) mode (c) with `--insecure` on both nodes: plaintext, what TLS costs a troupe call.
// Modes (a)-(b3) talk to a server child (this binary with `--serve`); to add such a mode, write a
// connect and a serve function (server_modes.h) and add a row to kModes (the server dispatches on
// the mode's tag, sent as the first byte of a connection). A mode that runs in processes of its
// own, like (c), gives a `run` function instead (troupe_modes.h). Every child is reaped on every
// path: the server exits when its stdin (the lifeline) closes; `troupe sim` gets SIGTERM when
// this process dies (PR_SET_PDEATHSIG) and cascades it to its nodes.
//
// This file: the mode table, the command line, and the two processes that run the modes (the
// client, which measures each and prints the table, and the server child); how a mode is
// measured is measure.h's.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/io.h>
#include <nlohmann/json.hpp>

#include "subprocess.h"
#include "troupe/transport.h"

#include "measure.h"
#include "server_modes.h"
#include "troupe_modes.h"

namespace troupe::bench {

// =============================================================================================
// The mode table

using ConnectFn = kj::Promise<kj::Own<Caller>> (*)(kj::Own<kj::AsyncIoStream> connection,
                                                   size_t payloadSize);
using ServeFn = kj::Promise<void> (*)(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
using RunFn = Figures (*)(const Options& options);

struct Mode {
  const char* key;    // JSON key and --modes name.
  const char* title;  // Table label.
  char tag;           // First byte of a connection: tells the server which ServeFn to run.
  ConnectFn connect;  // Modes measured against the server process: both set, `run` null.
  ServeFn serve;
  RunFn run;  // Modes measured in processes of their own: set, the others null.
};

namespace {

// In the order the bench runs them.
const Mode kModes[] = {
    {"raw_tcp", "(a) raw TCP", 'r', connectRaw, serveRaw, nullptr},
    {"capnp", "(b) capnp", 'c', connectCapnp, serveCapnp, nullptr},
    {"capnp_coalescing", "(b2) capnp + coalescing", 'k', connectCoalescing, serveCoalescing,
     nullptr},
    {"capnp_coalescing_tls", "(b3) b2 over TLS 1.3", 's', connectTls, serveTls, nullptr},
    {"troupe_actor_insecure", "(c0) actor call, --insecure", 'i', nullptr, nullptr,
     runTroupeInsecure},
    {"troupe_actor", "(c) troupe actor call (TLS)", 't', nullptr, nullptr, runTroupe},
    {"troupe_actor_restartable", "(c2) restartable actor", 'u', nullptr, nullptr,
     runTroupeRestartable},
};

/// The mode a client's header names, when it has a server side; nullptr otherwise.
const Mode* findMode(char tag) {
  for (auto& mode : kModes) {
    if (mode.tag == tag && mode.serve != nullptr) return &mode;
  }
  return nullptr;
}

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
      transport::setNoDelay(*connection);
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
    lifelineFd = nullptr;                  // it exits on EOF
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
  transport::setNoDelay(*connection);
  kj::byte header[kHeaderBytes];
  header[0] = mode.tag;
  uint32_t payloadSize = options.payloadBytes;
  memcpy(header + 1, &payloadSize, sizeof(payloadSize));
  connection->write(header, sizeof(header)).wait(io.waitScope);
  auto caller = mode.connect(kj::mv(connection), options.payloadBytes).wait(io.waitScope);

  Measurement measurement(kj::mv(caller), options, io.provider->getTimer());
  return measurement.run().wait(io.waitScope);
}

struct Result {
  // One row of the table: a mode and what it measured.
  const Mode* mode;
  Figures figures;
};

void printTable(const std::vector<Result>& results, const Options& options) {
  printf(
      "bench_rpc: %zu-byte payload, %u sequential calls, best of %u rounds of %u pipelined "
      "calls per window\n\n",
      options.payloadBytes, options.sequentialCalls, options.rounds, options.pipelinedCalls);
  printf("%-26s %9s %9s", "mode", "p50 us", "p99 us");
  for (uint window : options.windows)
    printf("  %12s", ("calls/s w=" + std::to_string(window)).c_str());
  printf("  %8s %8s\n", "usr us", "sys us");
  for (auto& [mode, figures] : results) {
    printf("%-26s %9.1f %9.1f", mode->title, figures.p50Us, figures.p99Us);
    for (uint window : options.windows) printf("  %12.0f", figures.callsPerSecond.at(window));
    printf("  %8.2f %8.2f\n", figures.userUsPerCall, figures.systemUsPerCall);
  }
  printf(
      "\nusr/sys us: user and system CPU time of the calling process per call, at w=%u (for (c),\n"
      "the driver's node, on the head).\n",
      options.windows.back());
}

void printJson(const std::vector<Result>& results, const Options& options) {
  nlohmann::json modes = nlohmann::json::object();
  for (auto& [mode, figures] : results) {
    auto entry = figuresToJson(figures);
    entry["title"] = mode->title;
    modes[mode->key] = entry;
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
  for (auto& mode : kModes) {
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
  std::vector<Result> results;
  for (auto* mode : selected) {
    auto figures = mode->run != nullptr ? mode->run(options) : measure(*mode, io, port, options);
    results.push_back({mode, kj::mv(figures)});
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
  for (auto& mode : kModes) keys.push_back(mode.key);
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
