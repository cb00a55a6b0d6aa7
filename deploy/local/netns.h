// `troupe sim --netns`: every simulated instance a separate host on a real (virtual) network.
//
// Each instance gets its own network namespace with one interface, `eth0` (the name SageMaker's
// resourceconfig.json gives), joined by a veth pair to a bridge in the root namespace that has
// no address of its own, so the instances reach each other and nothing else. Host names resolve
// the way they do on SageMaker: `algo-2` is in each namespace's /etc/hosts (ip-netns(8) mounts
// /etc/netns/<namespace>/hosts over /etc/hosts for the process it starts), so no host map is
// needed and each node listens on its eth0 address.
//
// Everything made is named after the simulator's pid (namespaces troupe-<pid>-<n>, bridge
// tb<pid>, links tv<pid>-<n>) and removed on every exit path the simulator sees (normal end,
// SIGTERM/SIGINT, an exception); what a SIGKILLed simulator left behind is removed by the next
// simulator that starts (its pid no longer runs).

#pragma once

#include <string>
#include <vector>

namespace sim {

class NetnsLab {
 public:
  static std::string unavailableReason();
  // Why --netns cannot work here ("not root", "no `ip` command"), or "" when it can.

  static void removeStale();
  // Removes namespaces, links and /etc/netns entries of simulators that no longer run.

  explicit NetnsLab(int ownerPid);
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;

  std::string addHost(const std::string& host);
  // Makes a namespace for `host` with eth0 up and an address; returns the address ("10.213.0.2").
  void writeHostsFiles();
  // After every addHost(): each namespace's /etc/hosts names every host.
  std::vector<std::string> execPrefix(const std::string& host) const;
  // The command that runs a program inside `host`'s namespace: {"ip", "netns", "exec", NAME}.
  std::string namespaceOf(const std::string& host) const;

  void removeAll();
  // Removes everything made so far. Idempotent; the destructor calls it.

 private:
  struct Host {
    std::string name, ns, ip;
  };
  int owner_;
  std::string bridge_;
  std::vector<Host> hosts_;
  bool removed_ = false;
};

}  // namespace sim
