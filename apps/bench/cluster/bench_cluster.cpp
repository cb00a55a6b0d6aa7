// bench_cluster: how long a cluster of N instances takes to form under `troupe sim`, and how long
// a heartbeat takes to be answered on the control path once it runs, idle and with every CPU
// oversubscribed by busy loops (4 per CPU by default), for N = 16, 64, 256 (and 512).
//
// Each run is `troupe sim` with N instances in groups of at most 64 (the last, dnn_group, on a GPU
// type, holds the head) running this binary as the app (`--app`): the driver waits --hold-ms and
// returns, every process exits. Measured from outside: the time from starting the sim to the
// head's "cluster formed: N nodes" line, the exit line of the sim, nodes declared lost; from the
// workers' own exit lines ("control path: K heartbeats answered, round trip p50 ..."), the round
// trips. Baselines, in the same run and under the same load: a raw TCP round trip on loopback
// (two threads, 16-byte ping-pong) and the time to start and reap N processes of /bin/true.
//
//   bench_cluster [--sizes 16,64,256] [--loads idle,busy] [--busy-per-cpu 4] [--hold-ms 3000]
//                 [--netns] [--json]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "subprocess.h"
#include "troupe/troupe.h"

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace sp = troupe::subprocess;

namespace {

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * v.size()))];
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Busy loops, `perCpu` on every CPU, while it lives (killed and reaped after).
class Busy {
 public:
  Busy(int perCpu) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < cpus * perCpu; ++i) {
      sp::Spec spec;
      spec.argv = {"sh", "-c", "while :; do :; done"};
      spec.ownProcessGroup = true;
      spec.parentDeathSignal = SIGKILL;
      loops_.push_back(std::make_unique<sp::Child>(spec));
    }
  }

 private:
  std::vector<std::unique_ptr<sp::Child>> loops_;
};

// The baseline: 16-byte round trips between two threads over loopback TCP, in ms.
std::vector<double> tcpRoundTrips(int count) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  listen(listener, 1);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread echo([listener]() {
    int c = accept(listener, nullptr, nullptr);
    char buf[16];
    while (recv(c, buf, sizeof buf, MSG_WAITALL) == sizeof buf) send(c, buf, sizeof buf, 0);
    close(c);
  });
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  std::vector<double> ms;
  char buf[16] = {};
  for (int i = 0; i < count; ++i) {
    auto t0 = Clock::now();
    send(s, buf, sizeof buf, 0);
    if (recv(s, buf, sizeof buf, MSG_WAITALL) != sizeof buf) break;
    ms.push_back(secondsSince(t0) * 1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a heartbeat is not a flood
  }
  close(s);
  echo.join();
  close(listener);
  return ms;
}

// The baseline: start N processes of /bin/true and reap them all, in seconds.
double spawnFloor(int n) {
  auto t0 = Clock::now();
  std::vector<std::unique_ptr<sp::Child>> children;
  for (int i = 0; i < n; ++i) {
    sp::Spec spec;
    spec.argv = {"true"};
    children.push_back(std::make_unique<sp::Child>(spec));
  }
  for (auto& c : children) c->wait();
  return secondsSince(t0);
}

struct Options {
  std::vector<int> sizes = {16, 64, 256};
  std::vector<std::string> loads = {"idle", "busy"};
  int busyPerCpu = 4;
  unsigned holdMs = 3000;
  bool netns = false;
  bool json = false;
};

json runOne(const Options& o, const std::string& self, int n, const std::string& load) {
  std::unique_ptr<Busy> busy;
  if (load == "busy") busy = std::make_unique<Busy>(o.busyPerCpu);
  json r = {{"instances", n}, {"load", load}};
  // Groups of at most 64 (troupe sim's limit); the last is the head's (a GPU type).
  int groups = std::max(4, (n + 63) / 64);
  std::vector<std::string> argv = {TROUPE_BINARY, "sim"};
  if (o.netns) argv.push_back("--netns");
  for (int g = 0; g < groups; ++g) {
    int count = n / groups + (g < n % groups ? 1 : 0);
    std::string name = g == groups - 1 ? "dnn_group" : "g" + std::to_string(g + 1);
    std::string type = g == groups - 1 ? "ml.p3.2xlarge" : "ml.c5.xlarge";
    argv.insert(argv.end(), {"--group", name + "=" + std::to_string(count) + ":" + type});
  }
  argv.insert(argv.end(), {"--", self, "--app", "--hold-ms", std::to_string(o.holdMs)});
  char dir[] = "/tmp/bench-cluster-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  std::string out = std::string(dir) + "/sim.out";
  sp::Spec spec;
  spec.argv = argv;
  spec.out = sp::Stream::file(out);
  spec.errToOut = true;
  spec.ownProcessGroup = true;
  spec.cwd = dir;
  auto t0 = Clock::now();
  sp::Child sim(spec);
  double formed = -1;
  std::optional<int> code;
  std::string formedLine = "cluster formed: ";
  while (!(code = sim.poll())) {
    if (formed < 0 && readFile(out).find(formedLine) != std::string::npos) formed = secondsSince(t0);
    if (secondsSince(t0) > 600) {
      sim.stop(std::chrono::seconds(5));
      code = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(formed < 0 ? 10 : 100));
  }
  double total = secondsSince(t0);
  std::string text = readFile(out);
  if (formed < 0 && text.find(formedLine) != std::string::npos) formed = total;
  static const std::regex rtt(
      R"(control path: (\d+) heartbeats answered, round trip p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms)");
  std::vector<double> p50s, p99s, maxes;
  uint64_t answered = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), rtt), end; it != end; ++it) {
    answered += std::stoull((*it)[1]);
    p50s.push_back(std::stod((*it)[2]));
    p99s.push_back(std::stod((*it)[3]));
    maxes.push_back(std::stod((*it)[4]));
  }
  size_t lost = 0;
  for (size_t at = 0; (at = text.find(" was lost: ", at)) != std::string::npos; ++at) ++lost;
  std::smatch m;
  static const std::regex formedCount(R"(cluster formed: (\d+) nodes)");
  int formedNodes = std::regex_search(text, m, formedCount) ? std::stoi(m[1]) : 0;
  bool allZero = text.find("troupe sim: all " + std::to_string(n) + " instances exited 0") !=
                 std::string::npos;
  auto tcp = tcpRoundTrips(300);
  r["sim_exit"] = code.value_or(-1);
  r["every_instance_exited_0"] = allZero;
  r["formed_nodes"] = formedNodes;
  r["formation_s"] = formed;
  r["job_s"] = total;
  r["nodes_lost"] = lost;
  r["workers_reporting"] = p50s.size();
  r["heartbeats_answered"] = answered;
  r["heartbeat_rtt_ms"] = {{"median_of_p50", percentile(p50s, 0.5)},
                           {"max_p99", p50s.empty() ? -1 : *std::max_element(p99s.begin(), p99s.end())},
                           {"max", maxes.empty() ? -1 : *std::max_element(maxes.begin(), maxes.end())}};
  r["baseline_tcp_rtt_ms"] = {{"p50", percentile(tcp, 0.5)}, {"p99", percentile(tcp, 0.99)}};
  r["baseline_spawn_s"] = spawnFloor(n);
  if (!allZero || lost > 0) {
    // Keep the output of a run that went wrong.
    r["output"] = out;
  } else {
    std::remove(out.c_str());
    rmdir(dir);
  }
  return r;
}

int app(int argc, char* argv[]) {
  troupe::Registry types;
  return troupe::run(argc, argv, types, [](troupe::Driver& job) -> kj::Promise<void> {
    unsigned hold = 3000;
    auto& args = job.args();
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--hold-ms") hold = std::stoul(args[i + 1]);
    }
    return job.timer().afterDelay(hold * kj::MILLISECONDS);
  });
}

}  // namespace

int main(int argc, char* argv[]) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--app") return app(argc, argv);
  }
  Options o;
  CLI::App cli("bench_cluster: formation time and control-path heartbeat round trips of troupe "
               "sim clusters");
  cli.add_option("--sizes", o.sizes, "cluster sizes, e.g. 16,64,256,512")
      ->delimiter(',')
      ->check(CLI::Range(2, 1024));
  cli.add_option("--loads", o.loads, "idle, busy (busy loops on every CPU) or both")
      ->delimiter(',')
      ->check(CLI::IsMember({"idle", "busy"}));
  cli.add_option("--busy-per-cpu", o.busyPerCpu, "busy loops per CPU under load")
      ->check(CLI::Range(1, 16));
  cli.add_option("--hold-ms", o.holdMs, "how long the formed cluster runs (heartbeats flow)")
      ->check(CLI::Range(500u, 600000u));
  cli.add_flag("--netns", o.netns, "troupe sim --netns: a network namespace per instance (root)");
  cli.add_flag("--json", o.json, "one JSON object instead of the table");
  CLI11_PARSE(cli, argc, argv);
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "bench_cluster: cannot read /proc/self/exe\n");
    return 1;
  }
  self[len] = 0;

  json runs = json::array();
  for (int n : o.sizes) {
    for (auto& load : o.loads) {
      if (!o.json) fprintf(stderr, "bench_cluster: %d instances, %s...\n", n, load.c_str());
      runs.push_back(runOne(o, self, n, load));
    }
  }
  json out = {{"bench", "cluster"},
              {"cpus", sysconf(_SC_NPROCESSORS_ONLN)},
              {"busy_per_cpu", o.busyPerCpu},
              {"hold_ms", o.holdMs},
              {"netns", o.netns},
              {"runs", runs}};
  if (o.json) {
    printf("%s\n", out.dump(2).c_str());
  } else {
    printf("%9s %5s %8s %7s %5s %10s | %9s %9s %9s | %9s %9s %9s\n", "instances", "load",
           "formed s", "all 0", "lost", "reporting", "hb p50 ms", "hb p99 ms", "hb max ms",
           "tcp p50", "tcp p99", "spawn s");
    for (auto& r : runs) {
      printf("%9d %5s %8.2f %7s %5zu %10zu | %9.2f %9.2f %9.2f | %9.3f %9.3f %9.2f\n",
             r["instances"].get<int>(), r["load"].get<std::string>().c_str(),
             r["formation_s"].get<double>(), r["every_instance_exited_0"].get<bool>() ? "yes" : "NO",
             r["nodes_lost"].get<size_t>(), r["workers_reporting"].get<size_t>(),
             r["heartbeat_rtt_ms"]["median_of_p50"].get<double>(),
             r["heartbeat_rtt_ms"]["max_p99"].get<double>(), r["heartbeat_rtt_ms"]["max"].get<double>(),
             r["baseline_tcp_rtt_ms"]["p50"].get<double>(), r["baseline_tcp_rtt_ms"]["p99"].get<double>(),
             r["baseline_spawn_s"].get<double>());
      if (r.contains("output")) printf("  (output kept: %s)\n", r["output"].get<std::string>().c_str());
    }
  }
  bool ok = true;
  for (auto& r : runs) ok = ok && r["every_instance_exited_0"].get<bool>();
  return ok ? 0 : 1;
}
