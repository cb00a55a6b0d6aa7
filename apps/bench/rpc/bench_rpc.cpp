// bench_rpc: what one remote call costs on this stack, across two processes over TCP loopback.
//
// The bench re-executes itself with `--serve` as the server process and measures, for each mode
// of the mode table, the round-trip time of sequential calls (p50/p99) and the throughput of
// pipelined calls with a window of calls in flight. Modes:
//   (a)  raw TCP ping-pong of the payload (TCP_NODELAY), one write and one read per message;
//   (b)  a Cap'n Proto call over plain TwoPartyVatNetwork (bench.capnp, no troupe runtime);
//   (b2) the same with troupe::CoalescingStream under the network on both ends.
// To add a mode (e.g. "(c) troupe actor call"), write a Caller and a serve function and add a row
// to kModes; the server dispatches on the mode's tag, sent as the first byte of a connection.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdio>
#include <map>
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

extern char** environ;

namespace troupe::bench {
namespace {

// =============================================================================================
// Modes

class Caller {
  // The client side of one connection in some mode. `call()` may be invoked again before
  // earlier calls completed (pipelining); calls complete in order.
 public:
  virtual ~Caller() noexcept(false) = default;
  virtual kj::Promise<void> call() = 0;
};

using ConnectFn = kj::Own<Caller> (*)(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
using ServeFn = kj::Promise<void> (*)(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);

struct Mode {
  const char* key;    // JSON key and --modes name.
  const char* title;  // Table label.
  char tag;           // First byte of a connection: tells the server which ServeFn to run.
  ConnectFn connect;
  ServeFn serve;
};

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

kj::Own<Caller> connectRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return kj::heap<RawCaller>(kj::mv(connection), payloadSize);
}

kj::Promise<void> echoRaw(kj::AsyncIoStream& stream, kj::ArrayPtr<kj::byte> buffer) {
  return stream.tryRead(buffer.begin(), buffer.size(), buffer.size())
      .then([&stream, buffer](size_t n) -> kj::Promise<void> {
        if (n < buffer.size()) return kj::READY_NOW;  // The client hung up.
        return stream.write(buffer.begin(), buffer.size()).then([&stream, buffer]() {
          return echoRaw(stream, buffer);
        });
      });
}

kj::Promise<void> serveRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  auto buffer = kj::heapArray<kj::byte>(payloadSize);
  auto promise = echoRaw(*connection, buffer);
  return promise.attach(kj::mv(buffer), kj::mv(connection));
}

// --- (b) Cap'n Proto, (b2) Cap'n Proto over CoalescingStream ------------------------------------

class EchoServer final : public Echo::Server {
 protected:
  kj::Promise<void> echo(EchoContext context) override {
    context.getResults().setPayload(context.getParams().getPayload());
    return kj::READY_NOW;
  }
};

class CapnpCaller final : public Caller {
  // A TwoPartyVatNetwork client over `connection`, optionally through a CoalescingStream.
 public:
  CapnpCaller(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize, bool coalesce)
      : stream(coalesce ? kj::heap<CoalescingStream>(kj::mv(connection)) : kj::mv(connection)),
        network(*stream, capnp::rpc::twoparty::Side::CLIENT),
        rpc(capnp::makeRpcClient(network)),
        echo(bootstrap()),
        payload(kj::heapArray<kj::byte>(payloadSize)) {
    memset(payload.begin(), 'x', payload.size());
  }

  kj::Promise<void> call() override {
    auto request = echo.echoRequest();
    request.setPayload(payload);
    return request.send().ignoreResult();
  }

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

kj::Own<Caller> connectCapnp(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return kj::heap<CapnpCaller>(kj::mv(connection), payloadSize, false);
}

kj::Own<Caller> connectCoalescing(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize) {
  return kj::heap<CapnpCaller>(kj::mv(connection), payloadSize, true);
}

kj::Promise<void> serveStream(kj::Own<kj::AsyncIoStream> stream) {
  auto network = kj::heap<capnp::TwoPartyVatNetwork>(*stream, capnp::rpc::twoparty::Side::SERVER);
  auto rpc = kj::heap(capnp::makeRpcServer(*network, kj::heap<EchoServer>()));
  auto done = network->onDisconnect();
  return done.attach(kj::mv(rpc), kj::mv(network), kj::mv(stream));
}

kj::Promise<void> serveCapnp(kj::Own<kj::AsyncIoStream> connection, size_t) {
  return serveStream(kj::mv(connection));
}

kj::Promise<void> serveCoalescing(kj::Own<kj::AsyncIoStream> connection, size_t) {
  return serveStream(kj::heap<CoalescingStream>(kj::mv(connection)));
}

const Mode kModes[] = {
    {"raw_tcp", "(a) raw TCP", 'r', connectRaw, serveRaw},
    {"capnp", "(b) capnp", 'c', connectCapnp, serveCapnp},
    {"capnp_coalescing", "(b2) capnp + coalescing", 'k', connectCoalescing, serveCoalescing},
};

const Mode* findMode(char tag) {
  for (auto& mode : kModes) {
    if (mode.tag == tag) return &mode;
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

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, lifeline[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, report[1], STDOUT_FILENO);
    char self[] = "/proc/self/exe";
    char name[] = "bench_rpc";
    char serveFlag[] = "--serve";
    char* argv[] = {name, serveFlag, nullptr};
    int error = posix_spawn(&pid, self, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    KJ_REQUIRE(error == 0, "could not start the bench server process", strerror(error));
  }

  ~ServerProcess() {
    lifelineFd = nullptr;
    int status;
    for (int i = 0; i < 300; ++i) {  // Up to 3 s.
      if (waitpid(pid, &status, WNOHANG) == pid) return;
      usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
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
  pid_t pid = 0;
  kj::AutoCloseFd lifelineFd;
  kj::AutoCloseFd reportFd;
};

struct Options {
  size_t payloadBytes = 64;
  uint sequentialCalls = 5000;
  uint pipelinedCalls = 50000;
  uint rounds = 2;
  std::vector<uint> windows = {128, 1024};
  uint warmupCalls = 1000;
  bool json = false;
};

struct Figures {
  const Mode* mode;
  double p50Us = 0;
  double p99Us = 0;
  std::map<uint, double> callsPerSecond;  // By window.
  double userUsPerCall = 0;  // Client process CPU, in the best round at the last window.
  double systemUsPerCall = 0;
};

struct CpuTime {
  double user = 0;
  double system = 0;
};

/// User and system CPU seconds of this process so far.
CpuTime cpuTime() {
  struct rusage usage;
  KJ_SYSCALL(getrusage(RUSAGE_SELF, &usage));
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

/// Issues calls on `caller` one after another until `remaining` is zero.
kj::Promise<void> callChain(Caller& caller, uint& remaining) {
  if (remaining == 0) return kj::READY_NOW;
  --remaining;
  return caller.call().then([&caller, &remaining]() { return callChain(caller, remaining); });
}

/// Runs `calls` calls with `window` of them in flight at any time.
void runPipelined(Caller& caller, uint calls, uint window, kj::WaitScope& waitScope) {
  uint remaining = calls;
  auto chains = kj::heapArrayBuilder<kj::Promise<void>>(window);
  for (uint i = 0; i < window; ++i) chains.add(callChain(caller, remaining));
  kj::joinPromises(chains.finish()).wait(waitScope);
}

double percentile(std::vector<double>& sorted, double p) {
  size_t index = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[index];
}

Figures measure(const Mode& mode, kj::AsyncIoContext& io, uint port, const Options& options) {
  auto address = io.provider->getNetwork().parseAddress("127.0.0.1", port).wait(io.waitScope);
  auto connection = address->connect().wait(io.waitScope);
  setNoDelay(*connection);
  kj::byte header[kHeaderBytes];
  header[0] = mode.tag;
  uint32_t payloadSize = options.payloadBytes;
  memcpy(header + 1, &payloadSize, sizeof(payloadSize));
  connection->write(header, sizeof(header)).wait(io.waitScope);
  auto caller = mode.connect(kj::mv(connection), options.payloadBytes);

  Figures figures;
  figures.mode = &mode;
  runPipelined(*caller, options.warmupCalls, 1, io.waitScope);

  std::vector<double> roundTrips;
  roundTrips.reserve(options.sequentialCalls);
  for (uint i = 0; i < options.sequentialCalls; ++i) {
    auto start = std::chrono::steady_clock::now();
    caller->call().wait(io.waitScope);
    std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    roundTrips.push_back(elapsed.count());
  }
  std::sort(roundTrips.begin(), roundTrips.end());
  figures.p50Us = percentile(roundTrips, 0.50);
  figures.p99Us = percentile(roundTrips, 0.99);

  for (uint window : options.windows) {
    // Best of `rounds`: the machine is shared, and a round that lost its core says nothing.
    double best = 0;
    for (uint round = 0; round < options.rounds; ++round) {
      auto cpuStart = cpuTime();
      auto start = std::chrono::steady_clock::now();
      runPipelined(*caller, options.pipelinedCalls, window, io.waitScope);
      std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      auto cpuEnd = cpuTime();
      double rate = options.pipelinedCalls / elapsed.count();
      if (rate <= best) continue;
      best = rate;
      figures.callsPerSecond[window] = rate;
      figures.userUsPerCall = (cpuEnd.user - cpuStart.user) * 1e6 / options.pipelinedCalls;
      figures.systemUsPerCall = (cpuEnd.system - cpuStart.system) * 1e6 / options.pipelinedCalls;
    }
  }
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
  printf("\nusr/sys us: user and system CPU time of the client process per call, at w=%u.\n",
         options.windows.back());
}

void printJson(const std::vector<Figures>& results, const Options& options) {
  nlohmann::json modes = nlohmann::json::object();
  for (auto& figures : results) {
    nlohmann::json perWindow = nlohmann::json::object();
    for (auto& [window, rate] : figures.callsPerSecond) perWindow[std::to_string(window)] = rate;
    modes[figures.mode->key] = {{"title", figures.mode->title},
                                {"p50_us", figures.p50Us},
                                {"p99_us", figures.p99Us},
                                {"calls_per_s", perWindow},
                                {"client_user_us_per_call", figures.userUsPerCall},
                                {"client_system_us_per_call", figures.systemUsPerCall}};
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
  ServerProcess server;  // Before setupAsyncIo(): the child must not inherit KJ's signal state.
  uint port = server.readPort();
  auto io = kj::setupAsyncIo();
  std::vector<Figures> results;
  for (auto& mode : kModes) {
    if (!only.empty() && std::find(only.begin(), only.end(), mode.key) == only.end()) continue;
    results.push_back(measure(mode, io, port, options));
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
  signal(SIGPIPE, SIG_IGN);

  Options options;
  bool serveMode = false;
  std::vector<std::string> only;
  CLI::App app{"Round trip and pipelined throughput of raw TCP and Cap'n Proto calls"};
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
  app.add_option("--windows", options.windows, "calls in flight, one run per value");
  app.add_option("--modes", only, "modes to run (raw_tcp, capnp, capnp_coalescing); default all");
  CLI11_PARSE(app, argc, argv);

  try {
    return serveMode ? serve() : runClient(options, only);
  } catch (const kj::Exception& exception) {
    fprintf(stderr, "bench_rpc: %s\n", kj::str(exception).cStr());
    return 1;
  }
}
