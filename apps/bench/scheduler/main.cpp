// bench_scheduler: placement decisions per second and memory per node for 100, 1,000 and
// 10,000 nodes in 10 instance groups, spread and pack.
//
// The loop is what the head does when actors start and stop: place, reserve what the placement
// asks for, and once `nodes` reservations are outstanding release the oldest, so the cluster
// stays about as full as it started. Each decision therefore pays for place + reserve + release.
// Requests rotate over the groups and mix group(g).cpus(1), group(g).gpus(1) on GPU groups,
// prefer(g).cpus(2) and any().cpus(1).labels("zone=..").
//
// Memory per node is the heap the view holds (nodes, labels, index) divided by the node count,
// counted by the replaced global operator new/delete below.
//
// Each rate is given per second of the wall clock and per CPU-second of this process; on a busy
// machine the first falls with the share of a CPU it gets, the second does not.
//
// Usage: bench_scheduler [--json] [--seconds S]   (S: time per configuration, default 0.5)

#include <malloc.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/sched/sched.h"

// -- heap accounting --------------------------------------------------------------------------

static size_t gLiveBytes = 0;

void* operator new(size_t size) {
  void* p = std::malloc(size ? size : 1);
  if (!p) throw std::bad_alloc();
  gLiveBytes += malloc_usable_size(p);
  return p;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  gLiveBytes -= malloc_usable_size(p);
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  operator delete(p);
}

// -- workload ---------------------------------------------------------------------------------

namespace {

using namespace troupe::sched;
using Clock = std::chrono::steady_clock;

// One instance type per group: five CPU groups, five GPU groups.
const char* const kGroupTypes[10] = {
    "ml.c5.9xlarge", "ml.c5.18xlarge", "ml.c5.4xlarge", "ml.m5.xlarge",    "ml.c5.2xlarge",
    "ml.p3.2xlarge", "ml.p3.8xlarge",  "ml.g5.xlarge",  "ml.p4d.24xlarge", "ml.g5.48xlarge"};

std::string groupName(size_t g) {
  return "group_" + std::to_string(g);
}

ClusterView buildCluster(size_t nodes) {
  ClusterView view;
  const char* zones[] = {"a", "b", "c"};
  for (size_t i = 0; i < nodes; ++i) {
    size_t g = i % 10;
    NodeSpec spec;
    spec.id = NodeId(i + 1);
    spec.host = "algo-" + std::to_string(i + 1);
    spec.group = groupName(g);
    spec.instanceType = kGroupTypes[g];
    spec.labels["zone"] = zones[i % 3];
    view.addNode(std::move(spec));
  }
  return view;
}

std::vector<Placement> requestMix(Placement::Strategy strategy) {
  std::vector<Placement> mix;
  for (size_t g = 0; g < 10; ++g) {
    Placement base = Placement::group(groupName(g));
    mix.push_back(base);
    mix.push_back(g >= 5 ? base.gpus(1) : base.cpus(2));
    mix.push_back(Placement::prefer(groupName(g)).cpus(2));
    mix.push_back(Placement::any().labels(g % 2 ? "zone=a" : "zone in (b, c)"));
  }
  for (auto& p : mix) p = strategy == Placement::Strategy::PACK ? p.pack() : p.spread();
  return mix;
}

struct Result {
  size_t nodes;
  std::string strategy;
  uint64_t decisions;
  double seconds;
  double decisionsPerSecond;
  double cpuSeconds;  // this process's CPU time over the loop: what the placing itself cost
  double decisionsPerCpuSecond;
  double placedFraction;
  double bytesPerNode;
};

// The process's CPU time: a rate per CPU-second does not fall with a busy machine's share of its
// CPUs, as the wall-clock rate does (bench_smoke_test's floor judges it).
double cpuNow() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

Result run(size_t nodes, Placement::Strategy strategy, double seconds) {
  size_t before = gLiveBytes;
  ClusterView view = buildCluster(nodes);
  double bytesPerNode = double(gLiveBytes - before) / double(nodes);

  std::vector<Placement> mix = requestMix(strategy);
  struct Held {
    NodeId id;
    const Resources* amount;
  };
  std::deque<Held> held;
  uint64_t decisions = 0, placed = 0;
  double cpuStart = cpuNow();
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration<double>(seconds);
  while (true) {
    // Check the clock every 256 decisions so the clock is not what we measure.
    for (int i = 0; i < 256; ++i, ++decisions) {
      const Placement& p = mix[decisions % mix.size()];
      Decision d = place(view, p);
      if (auto* at = std::get_if<Placed>(&d)) {
        if (!view.reserve(at->nodeId, p.getResources())) std::abort();  // place() lied
        held.push_back({at->nodeId, &p.getResources()});
        ++placed;
      }
      if (held.size() > nodes) {
        view.release(held.front().id, *held.front().amount);
        held.pop_front();
      }
    }
    if (Clock::now() >= deadline) break;
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = cpuNow() - cpuStart;
  return {nodes,
          strategy == Placement::Strategy::PACK ? "pack" : "spread",
          decisions,
          elapsed,
          double(decisions) / elapsed,
          cpu,
          cpu > 0 ? double(decisions) / cpu : 0.0,
          double(placed) / double(decisions),
          bytesPerNode};
}

}  // namespace

int main(int argc, char* argv[]) {
  bool json = false;
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--seconds S]\n", argv[0]);
      return 2;
    }
  }

  std::vector<Result> results;
  for (size_t nodes : {100, 1000, 10000}) {
    for (auto strategy : {Placement::Strategy::SPREAD, Placement::Strategy::PACK}) {
      results.push_back(run(nodes, strategy, seconds));
    }
  }

  if (json) {
    nlohmann::json out;
    out["bench"] = "scheduler";
    out["groups"] = 10;
    out["loop"] = "place + reserve, release oldest beyond `nodes` outstanding";
    for (const auto& r : results) {
      out["results"].push_back({{"nodes", r.nodes},
                                {"strategy", r.strategy},
                                {"decisions", r.decisions},
                                {"seconds", r.seconds},
                                {"decisions_per_s", r.decisionsPerSecond},
                                {"cpu_seconds", r.cpuSeconds},
                                {"decisions_per_cpu_s", r.decisionsPerCpuSecond},
                                {"placed_fraction", r.placedFraction},
                                {"bytes_per_node", r.bytesPerNode}});
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%8s  %-7s  %14s  %16s  %8s  %14s\n", "nodes", "strategy", "decisions/s",
              "per CPU-second", "placed", "bytes/node");
  for (const auto& r : results) {
    std::printf("%8zu  %-7s  %14.0f  %16.0f  %7.1f%%  %14.0f\n", r.nodes, r.strategy.c_str(),
                r.decisionsPerSecond, r.decisionsPerCpuSecond, 100 * r.placedFraction,
                r.bytesPerNode);
  }
  return 0;
}
