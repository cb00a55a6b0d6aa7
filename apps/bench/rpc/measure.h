// How bench_rpc measures a mode, the same way for every mode: its options, the figures it
// reports (and their JSON), the Caller a mode gives it, and the Measurement that drives the
// Caller. Asynchronous, so that it also runs inside a troupe driver, which must not wait.

#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/memory.h>
#include <kj/timer.h>
#include <nlohmann/json.hpp>

#include "bench.capnp.h"

namespace troupe::bench {

// =============================================================================================
// Options, figures

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

inline nlohmann::json optionsToJson(const Options& options) {
  // What a measuring process needs (mode (c) hands it to the driver on the command line).
  return {{"payload", options.payloadBytes},     {"calls", options.sequentialCalls},
          {"pipelined", options.pipelinedCalls}, {"rounds", options.rounds},
          {"windows", options.windows},          {"warmup", options.warmupCalls},
          {"restartable", options.restartable}};
}

inline Options optionsFromJson(const nlohmann::json& in) {
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

struct Figures {
  double p50Us = 0;
  double p99Us = 0;
  std::map<uint, double> callsPerSecond;  // By window.
  double userUsPerCall = 0;  // Calling process CPU, in the best round at the last window.
  double systemUsPerCall = 0;
};

inline nlohmann::json figuresToJson(const Figures& figures) {
  nlohmann::json perWindow = nlohmann::json::object();
  for (auto& [window, rate] : figures.callsPerSecond) perWindow[std::to_string(window)] = rate;
  return {{"p50_us", figures.p50Us},
          {"p99_us", figures.p99Us},
          {"calls_per_s", perWindow},
          {"client_user_us_per_call", figures.userUsPerCall},
          {"client_system_us_per_call", figures.systemUsPerCall}};
}

inline Figures figuresFromJson(const nlohmann::json& in) {
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

// =============================================================================================
// What a mode gives the measurement

class Caller {
  // The client side of one connection in some mode. `call()` may be invoked again before
  // earlier calls completed (pipelining); calls complete in order.
 public:
  virtual ~Caller() noexcept(false) = default;
  virtual kj::Promise<void> call() = 0;
};

// One echo call with `payload` through `echo` (an Echo or an EchoActor client): the call of every
// Cap'n Proto mode's Caller.
template <typename Client>
kj::Promise<void> sendEcho(Client& echo, kj::ArrayPtr<const kj::byte> payload) {
  auto request = echo.echoRequest();
  request.setPayload(payload);
  return request.send().ignoreResult();
}

// =============================================================================================
// Measuring

struct CpuTime {
  double user = 0;
  double system = 0;
};

/// User and system CPU seconds of this process so far.
inline CpuTime cpuTime() {
  struct rusage usage;
  KJ_SYSCALL(getrusage(RUSAGE_SELF, &usage));
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

/// Issues calls on `caller` one after another until `remaining` is zero.
inline kj::Promise<void> callChain(Caller& caller, uint& remaining) {
  if (remaining == 0) return kj::READY_NOW;
  --remaining;
  return caller.call().then([&caller, &remaining]() { return callChain(caller, remaining); });
}

/// Runs `calls` calls with `window` of them in flight at any time.
inline kj::Promise<void> runPipelined(Caller& caller, uint calls, uint window) {
  auto remaining = kj::heap<uint>(calls);
  auto chains = kj::heapArrayBuilder<kj::Promise<void>>(window);
  for (uint i = 0; i < window; ++i) chains.add(callChain(caller, *remaining));
  return kj::joinPromises(chains.finish()).attach(kj::mv(remaining));
}

inline double percentile(std::vector<double>& sorted, double p) {
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

}  // namespace troupe::bench
