#include "inject.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

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

std::function<void()> setLink(std::string ns, std::string state) {
  // eth0 is the namespace's end of its veth pair (deploy/local/netns.cpp).
  return [ns, state]() { runCommand({"ip", "-n", ns, "link", "set", "eth0", state}); };
}

}  // namespace

Plan signalOne(const harness::Instance& who, int sig) {
  Plan p;
  pid_t pid = who.pid;
  p.actions.push_back({Millis(0), [pid, sig]() { kill(pid, sig); }});
  p.text = sigName(sig) + " to " + nameOf(who);
  return p;
}

Plan signalAll(const Target& t, int sig) {
  std::vector<pid_t> pids = {t.head.pid};
  for (auto& d : t.data) pids.push_back(d.pid);
  Plan p;
  p.actions.push_back({Millis(0), [pids, sig]() {
                         for (auto pid : pids) kill(pid, sig);
                       }});
  p.text = sigName(sig) + " to every instance";
  return p;
}

Plan signalSim(const Target& t, int sig) {
  Plan p;
  pid_t pid = t.sim;
  p.actions.push_back({Millis(0), [pid, sig]() { kill(pid, sig); }});
  p.text = sigName(sig) + " to troupe sim";
  return p;
}

Plan freeze(const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  int hold = pick(rng, minMs, maxMs);
  pid_t pid = who.pid;
  Plan p;
  p.actions.push_back({Millis(0), [pid]() { kill(pid, SIGSTOP); }});
  p.actions.push_back({Millis(hold), [pid]() { kill(pid, SIGCONT); }});
  p.text = "SIGSTOP " + nameOf(who) + " for " + std::to_string(hold) + " ms";
  return p;
}

Plan partition(const Target& t, const harness::Instance& who, Rng& rng, int minMs, int maxMs) {
  auto ns = namespaceOf(t.simPid, who.host);
  Plan p;
  p.actions.push_back({Millis(0), setLink(ns, "down")});
  if (maxMs < 0) {
    p.text = "link down on " + nameOf(who) + " for good";
    return p;
  }
  int hold = pick(rng, minMs, maxMs);
  p.actions.push_back({Millis(hold), setLink(ns, "up")});
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
  p.actions.push_back({Millis(hold), [ns, failed, shown]() {
                         int rc = runCommand({"tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"});
                         auto now = shown();
                         if (rc != 0 || now.find("tbf") != std::string::npos) {
                           failed->push_back("tc qdisc del in " + ns + " (exit " +
                                             std::to_string(rc) + "; qdisc now: " + now + ")");
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
  p.actions.push_back({Millis(0), [g]() { g->randomBytes(3, 64 * 1024); }});
  p.actions.push_back({Millis(0), [g]() { g->halfOpen(2); }});
  p.actions.push_back({Millis(300), [g]() { g->hugeLengthPrefix(); }});
  p.actions.push_back({Millis(600), [g]() { g->hugeSegmentCount(); }});
  p.actions.push_back({Millis(900), [g]() { g->randomBytes(3, 1024); }});
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
  int status = troupe::subprocess::runToEnd(spec);  // output to /dev/null
  return status >= 0 && status < 126 ? status : -1;  // -1: could not run, or killed
}

}  // namespace faults
