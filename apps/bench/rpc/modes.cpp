// bench_rpc's modes (bench_rpc.h): raw TCP, Cap'n Proto (plain, coalescing, TLS) and troupe's
// actor calls, each a Caller and a serve function, or a run of its own under `troupe sim`.

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

kj::ArrayPtr<const Mode> modes() { return kModes; }

const Mode* findMode(char tag) {
  for (auto& mode : kModes) {
    if (mode.tag == tag && mode.serve != nullptr) return &mode;
  }
  return nullptr;
}

}  // namespace troupe::bench
