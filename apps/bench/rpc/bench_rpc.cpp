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

namespace troupe::bench {
namespace {

// =============================================================================================
// Options, figures, modes

struct Options {
  size_t payloadBytes = 64;
  uint sequentialCalls = 5000;
  uint pipelinedCalls = 50000;
  uint rounds = 2;
  std::vector<uint> windows = {128, 1024};
  uint warmupCalls = 1000;
  bool json = false;
  bool restartable = false;                  // mode (c2): the echo actor has a restart policy
  bool insecure = false;                     // mode (c0): the nodes run with --insecure
  std::string troupeBinary = TROUPE_BINARY;  // `troupe sim`, for mode (c).
};

nlohmann::json optionsToJson(const Options& options) {
  // What a measuring process needs (mode (c) hands it to the driver on the command line).
  return {{"payload", options.payloadBytes},     {"calls", options.sequentialCalls},
          {"pipelined", options.pipelinedCalls}, {"rounds", options.rounds},
          {"windows", options.windows},          {"warmup", options.warmupCalls},
          {"restartable", options.restartable}};
}

Options optionsFromJson(const nlohmann::json& in) {
  Options options;
  options.payloadBytes = in.at("payload").get<size_t>();
  options.sequentialCalls = in.at("calls").get<uint>();
  options.pipelinedCalls = in.at("pipelined").get<uint>();
  options.rounds = in.at("rounds").get<uint>();
  options.windows = in.at("windows").get<std::vector<uint>>();
  options.warmupCalls = in.at("warmup").get<uint>();
  options.restartable = in.at("restartable").get<bool>();
  return options;
}

struct Mode;

struct Figures {
  const Mode* mode = nullptr;
  double p50Us = 0;
  double p99Us = 0;
  std::map<uint, double> callsPerSecond;  // By window.
  double userUsPerCall = 0;  // Calling process CPU, in the best round at the last window.
  double systemUsPerCall = 0;
};

nlohmann::json figuresToJson(const Figures& figures) {
  nlohmann::json perWindow = nlohmann::json::object();
  for (auto& [window, rate] : figures.callsPerSecond) perWindow[std::to_string(window)] = rate;
  return {{"p50_us", figures.p50Us},
          {"p99_us", figures.p99Us},
          {"calls_per_s", perWindow},
          {"client_user_us_per_call", figures.userUsPerCall},
          {"client_system_us_per_call", figures.systemUsPerCall}};
}

Figures figuresFromJson(const nlohmann::json& in) {
  Figures figures;
  figures.p50Us = in.at("p50_us").get<double>();
  figures.p99Us = in.at("p99_us").get<double>();
  for (auto& [window, rate] : in.at("calls_per_s").items()) {
    figures.callsPerSecond[std::stoul(window)] = rate.get<double>();
  }
  figures.userUsPerCall = in.at("client_user_us_per_call").get<double>();
  figures.systemUsPerCall = in.at("client_system_us_per_call").get<double>();
  return figures;
}

class Caller {
  // The client side of one connection in some mode. `call()` may be invoked again before
  // earlier calls completed (pipelining); calls complete in order.
 public:
  virtual ~Caller() noexcept(false) = default;
  virtual kj::Promise<void> call() = 0;
};

using ConnectFn = kj::Own<Caller> (*)(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
using ServeFn = kj::Promise<void> (*)(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
using RunFn = Figures (*)(const Options& options);

struct Mode {
  const char* key;    // JSON key and --modes name.
  const char* title;  // Table label.
  char tag;           // First byte of a connection: tells the server which ServeFn to run.
  ConnectFn connect;  // Modes measured against the server process: both set, `run` null.
  ServeFn serve;
  RunFn run;         // Modes measured in processes of their own: set, the others null.
  bool tls = false;  // The client does a TLS handshake before `connect` gets the stream.
};

// =============================================================================================
// Measuring (asynchronous, so that it also runs inside a troupe driver, which must not wait)

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
kj::Promise<void> runPipelined(Caller& caller, uint calls, uint window) {
  auto remaining = kj::heap<uint>(calls);
  auto chains = kj::heapArrayBuilder<kj::Promise<void>>(window);
  for (uint i = 0; i < window; ++i) chains.add(callChain(caller, *remaining));
  return kj::joinPromises(chains.finish()).attach(kj::mv(remaining));
}

double percentile(std::vector<double>& sorted, double p) {
  size_t index = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[index];
}

class Measurement {
  // Warm-up, then sequential calls (p50/p99), then `rounds` pipelined runs per window, with a
  // short idle pause before each phase. The pause matters for mode (c): while calls keep a
  // troupe node's event loop busy it never polls, so its timers (heartbeats, the head's check
  // for lost nodes) stand still; a run of more than ~3 s without one idle moment makes the head
  // declare the other node lost (see docs/benchmarks.md, RPC).
 public:
  Measurement(kj::Own<Caller> caller, const Options& options, kj::Timer& timer)
      : caller(kj::mv(caller)), options(options), timer(timer) {}

  kj::Promise<Figures> run() {
    return runPipelined(*caller, options.warmupCalls, 1)
        .then([this]() { return pause(); })
        .then([this]() {
          roundTrips.reserve(options.sequentialCalls);
          return sequential(options.sequentialCalls);
        })
        .then([this]() {
          std::sort(roundTrips.begin(), roundTrips.end());
          figures.p50Us = percentile(roundTrips, 0.50);
          figures.p99Us = percentile(roundTrips, 0.99);
          return pipelined(0);
        })
        .then([this]() { return figures; });
  }

 private:
  kj::Own<Caller> caller;
  Options options;
  kj::Timer& timer;
  std::vector<double> roundTrips;
  Figures figures;

  kj::Promise<void> pause() { return timer.afterDelay(10 * kj::MILLISECONDS); }

  kj::Promise<void> sequential(uint remaining) {
    if (remaining == 0) return kj::READY_NOW;
    auto start = std::chrono::steady_clock::now();
    return caller->call().then([this, start, remaining]() {
      std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
      roundTrips.push_back(elapsed.count());
      return sequential(remaining - 1);
    });
  }

  kj::Promise<void> pipelined(size_t run) {
    // Run `run` is round `run % rounds` of window `run / rounds`. Best of `rounds`: the machine
    // is shared, and a round that lost its core says nothing.
    if (run == options.windows.size() * options.rounds) return kj::READY_NOW;
    uint window = options.windows[run / options.rounds];
    return pause().then([this, run, window]() { return pipelinedRun(run, window); });
  }

  kj::Promise<void> pipelinedRun(size_t run, uint window) {
    auto cpuStart = cpuTime();
    auto start = std::chrono::steady_clock::now();
    return runPipelined(*caller, options.pipelinedCalls, window)
        .then([this, run, window, cpuStart, start]() {
          std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
          auto cpuEnd = cpuTime();
          double rate = options.pipelinedCalls / elapsed.count();
          auto& best = figures.callsPerSecond[window];
          if (rate > best) {
            best = rate;
            figures.userUsPerCall = (cpuEnd.user - cpuStart.user) * 1e6 / options.pipelinedCalls;
            figures.systemUsPerCall =
                (cpuEnd.system - cpuStart.system) * 1e6 / options.pipelinedCalls;
          }
          return pipelined(run + 1);
        });
  }
};

// =============================================================================================
// Modes

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

// One echo call with `payload` through `echo` (an Echo or an EchoActor client).
template <typename Client>
kj::Promise<void> sendEcho(Client& echo, kj::ArrayPtr<const kj::byte> payload) {
  auto request = echo.echoRequest();
  request.setPayload(payload);
  return request.send().ignoreResult();
}

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

  kj::Promise<void> call() override { return sendEcho(echo, payload); }

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

// --- (b3) Cap'n Proto over CoalescingStream over TLS -------------------------------------------

JobTls& benchTls() {
  // Both processes derive the same key pair from this secret, as a job's nodes do from theirs.
  static JobTls tls("bench_rpc: the secret both of its processes derive their TLS key from");
  return tls;
}

kj::Promise<void> serveTls(kj::Own<kj::AsyncIoStream> connection, size_t) {
  return benchTls().wrapServer(kj::mv(connection)).then([](kj::Own<kj::AsyncIoStream> secure) {
    return serveStream(kj::heap<CoalescingStream>(kj::mv(secure)));
  });
}

// --- (c) troupe actor call --------------------------------------------------------------------

constexpr char kNodeFlag[] = "--troupe-node";
// First argument of a bench_rpc process that is a troupe node; the next one is the options.
constexpr char kFiguresMarker[] = "bench_rpc figures: ";
// The driver prints this, then the figures as JSON, on one line of its stdout.

class EchoActorServer final : public ActorBase<EchoActor> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> echo(EchoContext context) override {
    context.getResults().setPayload(context.getParams().getPayload());
    return kj::READY_NOW;
  }
};

class ActorCaller final : public Caller {
  // Calls an EchoActor through its reference, as any troupe driver or actor would.
 public:
  ActorCaller(EchoActor::Client echo, size_t payloadSize)
      : echo(kj::mv(echo)), payload(kj::heapArray<kj::byte>(payloadSize)) {
    memset(payload.begin(), 'x', payload.size());
  }

  kj::Promise<void> call() override { return sendEcho(echo, payload); }

 private:
  EchoActor::Client echo;
  kj::Array<kj::byte> payload;
};

/// The driver of the mode (c) cluster: runs on the head (group a), calls an actor on group b.
kj::Promise<void> driveTroupe(Driver& job) {
  auto& args = job.args();
  auto flag = std::find(args.begin(), args.end(), kNodeFlag);
  KJ_REQUIRE(flag != args.end() && flag + 1 != args.end(), "no options after --troupe-node");
  auto options = optionsFromJson(nlohmann::json::parse(*(flag + 1)));

  // A restart policy makes the reference a local forwarding capability (runtime/src/actor/rebind.cpp).
  auto echo = job.spawn<EchoActor>(
      Placement::group("b"), options.restartable ? SpawnOptions().restarts(1) : SpawnOptions());
  KJ_REQUIRE(echo.address().address != job.node().address().cStr(),
             "the echo actor must live on another node than the driver", echo.address().describe());
  auto measurement = kj::heap<Measurement>(
      kj::heap<ActorCaller>(kj::mv(echo), options.payloadBytes), options, job.timer());
  auto done = measurement->run();
  return done
      .then([](Figures figures) {
        printf("%s%s\n", kFiguresMarker, figuresToJson(figures).dump().c_str());
        fflush(stdout);
      })
      .attach(kj::mv(measurement));
}

/// main() of a bench_rpc process started by `troupe sim` (never returns).
int runTroupeNode(int argc, char** argv) {
  Registry types;
  types.add<EchoActorServer>();  // "bench.EchoActor"
  return troupe::run(argc, argv, types, driveTroupe);
}

class SimProcess {
  // `troupe sim` running a two-node cluster of this binary, its stdout and stderr on one pipe.
  // It gets SIGTERM if this process dies first (PR_SET_PDEATHSIG); its nodes die with it. The
  // destructor always reaps it: SIGTERM (a graceful cascade), then SIGKILL after a while.
 public:
  explicit SimProcess(const std::vector<std::string>& args) {
    int out[2];
    KJ_SYSCALL(pipe2(out, O_CLOEXEC));
    kj::AutoCloseFd outWrite(out[1]);
    outputFd = kj::AutoCloseFd(out[0]);
    troupe::subprocess::Spec spec;
    spec.argv = args;
    spec.out = troupe::subprocess::Stream::of(out[1]);
    spec.errToOut = true;
    spec.parentDeathSignal = SIGTERM;
    child = kj::heap<troupe::subprocess::Child>(spec);
  }

  ~SimProcess() {
    // SIGTERM (the graceful cascade), SIGKILL after longer than the simulator's grace period.
    child->stop(std::chrono::milliseconds(15000));
  }

  KJ_DISALLOW_COPY(SimProcess);

  /// Everything the simulator writes, until it closes its output (waits up to `timeoutMs`).
  std::string readAll(int timeoutMs) {
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    char buffer[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      struct pollfd pfd = {outputFd.get(), POLLIN, 0};
      int ready;
      KJ_SYSCALL(ready = poll(&pfd, 1, std::max<long>(0, left)));
      KJ_REQUIRE(ready > 0, "troupe sim did not finish in time", timeoutMs, text);
      ssize_t n;
      KJ_SYSCALL(n = read(outputFd.get(), buffer, sizeof(buffer)));
      if (n == 0) return text;
      text.append(buffer, n);
    }
  }

  /// The simulator's exit code (128 + signal if killed); -1 if it did not exit within `timeoutMs`.
  int waitFor(int timeoutMs) {
    auto status = child->wait(std::chrono::milliseconds(timeoutMs));
    return status ? *status : -1;
  }

 private:
  kj::Own<troupe::subprocess::Child> child;
  kj::AutoCloseFd outputFd;
};

std::string selfPath() {
  char path[PATH_MAX];
  ssize_t n;
  KJ_SYSCALL(n = readlink("/proc/self/exe", path, sizeof(path) - 1));
  return std::string(path, n);
}

Figures runTroupe(const Options& options) {
  KJ_REQUIRE(access(options.troupeBinary.c_str(), X_OK) == 0,
             "mode (c) needs the troupe binary (build the `troupe` target, or pass --troupe)",
             options.troupeBinary);
  // No "--" before the app: `troupe sim` (CLI11 prefix_command) rejects everything after one.
  // --env first: it takes every value up to the next flag.
  std::vector<std::string> args = {options.troupeBinary, "sim"};
  if (options.insecure) {
    for (auto env : {"a:TROUPE_INSECURE=1", "b:TROUPE_INSECURE=1"}) {
      args.push_back("--env");
      args.push_back(env);
    }
  }
  for (auto arg : {"--group", "a=1", "--group", "b=1", "--head-group", "a", "--grace-ms", "3000",
                   "--linger-ms", "5000"}) {
    args.push_back(arg);
  }
  for (auto arg : {selfPath(), std::string(kNodeFlag), optionsToJson(options).dump(),
                   std::string("--log-level"), std::string("warn")}) {
    args.push_back(arg);
  }
  SimProcess sim(args);
  // Cluster start-up, plus 100 us per call (10k calls/s would be far below any sane figure).
  uint64_t calls = options.warmupCalls + options.sequentialCalls +
                   uint64_t{options.pipelinedCalls} * options.rounds * options.windows.size();
  int timeoutMs = 60000 + static_cast<int>(std::min<uint64_t>(calls / 10, 1u << 30));
  auto output = sim.readAll(timeoutMs);
  int status = sim.waitFor(10000);
  kj::Maybe<Figures> figures;
  for (size_t at = output.find(kFiguresMarker); at != std::string::npos;
       at = output.find(kFiguresMarker, at + 1)) {
    auto begin = at + strlen(kFiguresMarker);
    auto json = nlohmann::json::parse(output.substr(begin, output.find('\n', begin) - begin));
    figures = figuresFromJson(json);
  }
  KJ_REQUIRE(status == 0 && figures != nullptr, "the troupe cluster of mode (c) failed", status,
             output);
  return KJ_ASSERT_NONNULL(figures);
}

Figures runTroupeRestartable(const Options& options) {
  auto restartable = options;
  restartable.restartable = true;
  return runTroupe(restartable);
}

Figures runTroupeInsecure(const Options& options) {
  auto insecure = options;
  insecure.insecure = true;
  return runTroupe(insecure);
}

const Mode kModes[] = {
    {"raw_tcp", "(a) raw TCP", 'r', connectRaw, serveRaw, nullptr},
    {"capnp", "(b) capnp", 'c', connectCapnp, serveCapnp, nullptr},
    {"capnp_coalescing", "(b2) capnp + coalescing", 'k', connectCoalescing, serveCoalescing,
     nullptr},
    {"capnp_coalescing_tls", "(b3) b2 over TLS 1.3", 's', connectCoalescing, serveTls, nullptr,
     true},
    {"troupe_actor_insecure", "(c0) actor call, --insecure", 'i', nullptr, nullptr,
     runTroupeInsecure},
    {"troupe_actor", "(c) troupe actor call (TLS)", 't', nullptr, nullptr, runTroupe},
    {"troupe_actor_restartable", "(c2) restartable actor", 'u', nullptr, nullptr,
     runTroupeRestartable},
};

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
