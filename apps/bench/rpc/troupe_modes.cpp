// bench_rpc's troupe modes (troupe_modes.h): the echo actor and the driver that calls it, the
// node's main(), and the `troupe sim` cluster the bench runs them in.

#include "troupe_modes.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <kj/debug.h>
#include <nlohmann/json.hpp>

#include "subprocess.h"
#include "troupe/troupe.h"

namespace troupe::bench {
namespace {

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

  // A restart policy makes the reference a local forwarding capability
  // (runtime/src/actor/rebind.cpp).
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

}  // namespace

int runTroupeNode(int argc, char** argv) {
  Registry types;
  types.add<EchoActorServer>();  // "bench.EchoActor"
  return troupe::run(argc, argv, types, driveTroupe);
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

}  // namespace troupe::bench
