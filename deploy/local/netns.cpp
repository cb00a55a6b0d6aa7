#include "netns.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "subprocess.h"

namespace sim {

namespace fs = std::filesystem;

namespace {

// Runs a command to its end (output to /dev/null unless `out`); returns its exit status. Waits on
// that pid only, so it does not take children away from libuv.
int runCommand(const std::vector<std::string>& args, std::string* out = nullptr) {
  troupe::subprocess::Spec spec;
  spec.argv = args;
  return troupe::subprocess::runToEnd(spec, out);
}

void mustRun(const std::vector<std::string>& args) {
  std::string out;
  if (runCommand(args, &out) != 0) {
    std::string line;
    for (auto& a : args) line += (line.empty() ? "" : " ") + a;
    throw std::runtime_error("`" + line + "` failed: " + out);
  }
}

bool pidRuns(int pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

// The simulator pid in a name made by NetnsLab ("troupe-123-1", "tb123", "tv123-1"), or 0.
int ownerOf(const std::string& name) {
  std::string digits;
  for (auto prefix : {"troupe-", "tb", "tv"}) {
    if (name.rfind(prefix, 0) == 0) {
      auto rest = name.substr(strlen(prefix));
      digits = rest.substr(0, rest.find('-'));
      break;
    }
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoi(digits);
}

}  // namespace

std::string NetnsLab::unavailableReason() {
  if (geteuid() != 0) return "it needs root (network namespaces and veth pairs)";
  if (runCommand({"ip", "-V"}) != 0) return "the `ip` command (iproute2) is not installed";
  return "";
}

void NetnsLab::removeStale() {
  std::string out;
  if (runCommand({"ip", "netns", "list"}, &out) == 0) {
    std::stringstream ss(out);
    std::string line;
    while (std::getline(ss, line)) {
      auto name = line.substr(0, line.find(' '));
      int owner = ownerOf(name);
      if (name.rfind("troupe-", 0) == 0 && owner != 0 && !pidRuns(owner)) {
        runCommand({"ip", "netns", "delete", name});
      }
    }
  }
  if (runCommand({"ip", "-o", "link", "show"}, &out) == 0) {
    std::stringstream ss(out);
    std::string line;
    while (std::getline(ss, line)) {
      // "12: tb123: <BROADCAST,..." or "13: tv123-1@if2: ..."
      auto start = line.find(": ");
      if (start == std::string::npos) continue;
      auto name = line.substr(start + 2, line.find_first_of(":@", start + 2) - start - 2);
      int owner = ownerOf(name);
      if ((name.rfind("tb", 0) == 0 || name.rfind("tv", 0) == 0) && owner != 0 && !pidRuns(owner)) {
        runCommand({"ip", "link", "delete", name});
      }
    }
  }
  std::error_code ec;
  for (auto& entry : fs::directory_iterator("/etc/netns", ec)) {
    auto name = entry.path().filename().string();
    int owner = ownerOf(name);
    if (name.rfind("troupe-", 0) == 0 && owner != 0 && !pidRuns(owner)) {
      fs::remove_all(entry.path(), ec);
    }
  }
}

NetnsLab::NetnsLab(int ownerPid) : owner_(ownerPid), bridge_("tb" + std::to_string(ownerPid)) {
  mustRun({"ip", "link", "add", bridge_, "type", "bridge"});
  mustRun({"ip", "link", "set", bridge_, "up"});
}

NetnsLab::~NetnsLab() {
  removeAll();
}

std::string NetnsLab::addHost(const std::string& host) {
  auto n = std::to_string(hosts_.size() + 1);
  Host h{host, "troupe-" + std::to_string(owner_) + "-" + n,
         "10.213." + std::to_string((hosts_.size() + 2) / 256) + "." +
             std::to_string((hosts_.size() + 2) % 256)};
  hosts_.push_back(h);  // first, so removeAll() finds what a failure below leaves
  auto outside = "tv" + std::to_string(owner_) + "-" + n;
  auto inside = "tp" + std::to_string(owner_) + "-" + n;
  mustRun({"ip", "netns", "add", h.ns});
  mustRun({"ip", "link", "add", outside, "type", "veth", "peer", "name", inside});
  mustRun({"ip", "link", "set", inside, "netns", h.ns});
  mustRun({"ip", "-n", h.ns, "link", "set", inside, "name", "eth0"});
  mustRun({"ip", "-n", h.ns, "addr", "add", h.ip + "/16", "dev", "eth0"});
  mustRun({"ip", "-n", h.ns, "link", "set", "eth0", "up"});
  mustRun({"ip", "-n", h.ns, "link", "set", "lo", "up"});
  mustRun({"ip", "link", "set", outside, "master", bridge_});
  mustRun({"ip", "link", "set", outside, "up"});
  return h.ip;
}

void NetnsLab::writeHostsFiles() {
  for (auto& h : hosts_) {
    auto dir = fs::path("/etc/netns") / h.ns;
    fs::create_directories(dir);
    std::ofstream out(dir / "hosts");
    out << "127.0.0.1\tlocalhost\n";
    for (auto& other : hosts_) out << other.ip << "\t" << other.name << "\n";
  }
}

std::string NetnsLab::namespaceOf(const std::string& host) const {
  for (auto& h : hosts_) {
    if (h.name == host) return h.ns;
  }
  throw std::logic_error("no namespace for host " + host);
}

std::vector<std::string> NetnsLab::execPrefix(const std::string& host) const {
  return {"ip", "netns", "exec", namespaceOf(host)};
}

void NetnsLab::removeAll() {
  if (removed_) return;
  removed_ = true;
  std::error_code ec;
  for (auto& h : hosts_) {
    // Deleting the namespace deletes eth0 in it, and with it the veth's other end.
    runCommand({"ip", "netns", "delete", h.ns});
    fs::remove_all(fs::path("/etc/netns") / h.ns, ec);
  }
  for (size_t i = 1; i <= hosts_.size(); ++i) {
    runCommand({"ip", "link", "delete", "tv" + std::to_string(owner_) + "-" + std::to_string(i)});
  }
  runCommand({"ip", "link", "delete", bridge_});
  fs::remove("/etc/netns", ec);  // only when empty
}

}  // namespace sim
