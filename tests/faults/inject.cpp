#include "inject.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "garbage.h"
#include "subprocess.h"

namespace faults {

namespace {

std::string sigName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string nameOf(const harness::Instance& who) {
  return who.host + " (" + who.group + ")";
}

int pick(Rng& rng, int minMs, int maxMs) {
  return std::uniform_int_distribution<int>(minMs, maxMs)(rng);
}

// A process's state letter from /proc/PID/stat ('T' stopped, 'Z' zombie), or 0 when it is gone.
char stateOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? 0 : text[paren + 2];
}

// Polls `ok` for up to `ms`: whether it came true.
bool within(int ms, const std::function<bool()>& ok) {
  for (int waited = 0;; waited += 5) {
    if (ok()) return true;
    if (waited >= ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

using Failed = std::shared_ptr<std::vector<std::string>>;

// kill(), its result checked: a signal that was not sent is an injection that did not happen.
void sendSignal(pid_t pid, int sig, const std::string& who, const Failed& failed) {
  if (kill(pid, sig) != 0) {
    failed->push_back(sigName(sig) + " to " + who + " (pid " + std::to_string(pid) +
                      "): " + strerror(errno));
  }
}

// What `ip -n NS link show eth0` says.
std::string linkShown(const std::string& ns) {
  std::string text;
  troupe::subprocess::Spec spec;
  spec.argv = {"ip", "-n", ns, "link", "show", "eth0"};
  troupe::subprocess::runToEnd(spec, &text);
  return text;
}

// Sets eth0 in `ns` down or up and checks that it is: ip's exit code and the state it then shows
// (an interface that is down lacks ",UP" in its flags).
std::function<void()> setLink(std::string ns, std::string state, Failed failed) {
  // eth0 is the namespace's end of its veth pair (deploy/local/netns.cpp).
  return [ns, state, failed]() {
    int rc = runCommand({"ip", "-n", ns, "link", "set", "eth0", state});
    auto shown = linkShown(ns);
    bool up = shown.find(",UP") != std::string::npos || shown.find("<UP") != std::string::npos;
    if (rc != 0 || up != (state == "up")) {
      failed->push_back("ip link set eth0 " + state + " in " + ns + " (exit " + std::to_string(rc) +
                        "; now: " + shown.substr(0, shown.find('\n')) + ")");
    }
  };
}

}  // namespace

Plan signalOne(const harness::Instance& who, int sig) {
  Plan p;
  pid_t pid = who.pid;
  auto name = nameOf(who);
  auto failed = p.failed;
  p.actions.push_back({Millis(0), [pid, sig, name, failed]() {
                         sendSignal(pid, sig, name, failed);
                         if (sig == SIGKILL && !within(2000, [pid]() {
                               char st = stateOf(pid);
                               return st == 0 || st == 'Z';
                             })) {
                           failed->push_back(name + " still runs 2 s after SIGKILL");
                         }
                       }});
  p.text = sigName(sig) + " to " + name;
  return p;
}

Plan signalTwice(const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  int apart = pick(rng, minMs, maxMs);
  pid_t pid = who.pid;
  auto name = nameOf(who);
  Plan p;
  auto failed = p.failed;
  p.actions.push_back(
      {Millis(0), [pid, name, failed]() { sendSignal(pid, SIGTERM, name, failed); }});
  // The second may find the process gone already: that is the runtime's answer, not a miss.
  p.actions.push_back({Millis(apart), [pid]() { kill(pid, SIGTERM); }});
  p.text = "SIGTERM to " + name + " twice, " + std::to_string(apart) + " ms apart";
  return p;
}

Plan signalAll(const Target& t, int sig) {
  std::vector<std::pair<pid_t, std::string>> all = {{t.head.pid, nameOf(t.head)}};
  for (auto& d : t.data) all.emplace_back(d.pid, nameOf(d));
  Plan p;
  auto failed = p.failed;
  p.actions.push_back({Millis(0), [all, sig, failed]() {
                         for (auto& [pid, name] : all) sendSignal(pid, sig, name, failed);
                       }});
  p.text = sigName(sig) + " to every instance";
  return p;
}

Plan signalSim(const Target& t, int sig) {
  Plan p;
  pid_t pid = t.sim;
  auto failed = p.failed;
  p.actions.push_back(
      {Millis(0), [pid, sig, failed]() { sendSignal(pid, sig, "troupe sim", failed); }});
  p.text = sigName(sig) + " to troupe sim";
  return p;
}

Plan freeze(const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  int hold = pick(rng, minMs, maxMs);
  pid_t pid = who.pid;
  auto name = nameOf(who);
  Plan p;
  auto failed = p.failed;
  // Checked by the process's state: stopped ('T') after SIGSTOP, running again after SIGCONT.
  p.actions.push_back({Millis(0), [pid, name, failed]() {
                         sendSignal(pid, SIGSTOP, name, failed);
                         if (!within(500, [pid]() { return stateOf(pid) == 'T'; })) {
                           failed->push_back(name + " is not stopped after SIGSTOP (state '" +
                                             std::string(1, stateOf(pid) ? stateOf(pid) : '-') +
                                             "')");
                         }
                       }});
  p.actions.push_back({Millis(hold), [pid, name, failed]() {
                         if (stateOf(pid) != 'T') {
                           failed->push_back(name + " was no longer stopped when its hold ended");
                         }
                         sendSignal(pid, SIGCONT, name, failed);
                       }});
  p.text = "SIGSTOP " + name + " for " + std::to_string(hold) + " ms";
  return p;
}

Plan drainThenFreeze(const harness::Instance& who, Rng& rng, int holdMs) {
  // SIGTERM (a drain: the head waits 1.5 s to tell it from a stop of the whole job), then the
  // node frozen inside that window for `holdMs`, past the node timeout.
  int at = pick(rng, 200, 1000);
  auto frozen = freeze(who, rng, holdMs, holdMs);
  Plan p;
  p.failed = frozen.failed;
  pid_t pid = who.pid;
  auto name = nameOf(who);
  auto failed = p.failed;
  p.actions.push_back(
      {Millis(0), [pid, name, failed]() { sendSignal(pid, SIGTERM, name, failed); }});
  for (auto& a : frozen.actions) p.actions.push_back({a.at + Millis(at), a.run});
  p.text = "SIGTERM to " + name + ", then " + frozen.text + " from " + std::to_string(at) +
           " ms after it";
  return p;
}

Plan partition(const Target& t, const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  auto ns = namespaceOf(t.simPid, who.host);
  Plan p;
  p.actions.push_back({Millis(0), setLink(ns, "down", p.failed)});
  if (maxMs < 0) {
    p.text = "link down on " + nameOf(who) + " for good";
    return p;
  }
  int hold = pick(rng, minMs, maxMs);
  p.actions.push_back({Millis(hold), setLink(ns, "up", p.failed)});
  p.text = "link down on " + nameOf(who) + " for " + std::to_string(hold) + " ms";
  return p;
}

Plan slowLink(const Target& t, const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  auto ns = namespaceOf(t.simPid, who.host);
  Plan p;
  int hold = pick(rng, minMs, maxMs);
  auto failed = p.failed;
  // What `tc qdisc show` says of eth0 in the namespace.
  auto shown = [ns]() {
    std::string text;
    troupe::subprocess::Spec spec;
    spec.argv = {"tc", "-n", ns, "qdisc", "show", "dev", "eth0"};
    troupe::subprocess::runToEnd(spec, &text);
    return text;
  };
  p.actions.push_back({Millis(0), [ns, failed, shown]() {
                         int rc = runCommand({"tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root",
                                              "tbf", "rate", "8mbit", "burst", "32kbit", "latency",
                                              "400ms"});
                         auto now = shown();
                         if (rc != 0 || now.find("tbf") == std::string::npos) {
                           failed->push_back("tc qdisc add tbf in " + ns + " (exit " +
                                             std::to_string(rc) + "; qdisc now: " + now + ")");
                         }
                       }});
  p.actions.push_back(
      {Millis(hold), [ns, failed, shown]() {
         // That the link was slowed, not only that a qdisc existed: the shaper's counters
         // (`tc -s`) show traffic through it and packets it held back (overlimits).
         std::string stats;
         troupe::subprocess::Spec spec;
         spec.argv = {"tc", "-s", "-n", ns, "qdisc", "show", "dev", "eth0"};
         troupe::subprocess::runToEnd(spec, &stats);
         std::smatch m;
         static const std::regex counters(
             R"(Sent (\d+) bytes \d+ pkt \(dropped \d+, overlimits (\d+))");
         if (!std::regex_search(stats, m, counters) || std::stoull(m[1]) == 0 ||
             std::stoull(m[2]) == 0) {
           failed->push_back("the tbf on " + ns + "'s eth0 slowed nothing (tc -s: " + stats +
                             "): no bytes sent through it, or none held back");
         }
         int rc = runCommand({"tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"});
         auto now = shown();
         if (rc != 0 || now.find("tbf") != std::string::npos) {
           failed->push_back("tc qdisc del in " + ns + " (exit " + std::to_string(rc) +
                             "; qdisc now: " + now + ")");
         }
       }});
  p.text = "link of " + nameOf(who) + " limited to 8 Mbit/s for " + std::to_string(hold) + " ms";
  return p;
}

Plan garbage(const harness::Instance& who, Rng& rng) {
  auto g = std::make_shared<Garbage>(who.address, rng());
  Plan p;
  p.holds = g;
  // Each kind on its own, a little apart, so a node that survives one meets the next mid-job.
  // Every connection must reach the node: a stranger that could not connect tested nothing.
  auto failed = p.failed;
  auto step = [g, failed](std::function<void(Garbage&)> f) {
    return [g, failed, f]() {
      f(*g);
      for (auto& why : g->takeFailures()) failed->push_back(why);
    };
  };
  p.actions.push_back({Millis(0), step([](Garbage& x) { x.randomBytes(3, 64 * 1024); })});
  p.actions.push_back({Millis(0), step([](Garbage& x) { x.halfOpen(2); })});
  p.actions.push_back({Millis(300), step([](Garbage& x) { x.hugeLengthPrefix(); })});
  p.actions.push_back({Millis(600), step([](Garbage& x) { x.hugeSegmentCount(); })});
  p.actions.push_back({Millis(900), step([](Garbage& x) { x.randomBytes(3, 1024); })});
  p.text = "garbage on " + nameOf(who) + "'s port " + who.address;
  return p;
}

std::string namespaceOf(int simPid, const std::string& host) {
  auto n = host.substr(host.rfind('-') + 1);
  return "troupe-" + std::to_string(simPid) + "-" + n;
}

std::string netnsUnavailable() {
  if (geteuid() != 0) return "it needs root (network namespaces and veth pairs)";
  if (runCommand({"ip", "-V"}) != 0) return "no `ip` command (iproute2)";
  return "";
}

void removeNetnsLeftovers(int simPid, size_t instances) {
  std::error_code ec;
  for (size_t n = 1; n <= instances; ++n) {
    auto ns = namespaceOf(simPid, "algo-" + std::to_string(n));
    if (!std::filesystem::exists("/run/netns/" + ns)) continue;
    runCommand({"ip", "netns", "delete", ns});
    std::filesystem::remove_all("/etc/netns/" + ns, ec);
  }
  auto bridge = "tb" + std::to_string(simPid);
  if (std::filesystem::exists("/sys/class/net/" + bridge)) {
    runCommand({"ip", "link", "delete", bridge});
  }
}

int runCommand(const std::vector<std::string>& argv) {
  troupe::subprocess::Spec spec;
  spec.argv = argv;
  int status = troupe::subprocess::runToEnd(spec);   // output to /dev/null
  return status >= 0 && status < 126 ? status : -1;  // -1: could not run, or killed
}

}  // namespace faults
