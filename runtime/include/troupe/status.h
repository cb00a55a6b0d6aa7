// File: troupe/status.h
//
// A running job as its head sees it, fetched the way `troupe status` does:
//
//   troupe::EventLoop loop(1);
//   auto job = troupe::fetchStatus(loop, {"127.0.0.1:41002", secret});
//   for (auto& n : job.nodes) printf("%s %.0f%%\n", n.host.c_str(), n.cpuPercent);
//
// The client authenticates as a node does: it derives the job's TLS key from the secret and
// completes the TLS 1.3 handshake (with `insecure`, it sends the secret in its request instead).
// Then it asks the head's Gate for a snapshot (Gate.status, runtime/proto/troupe.capnp). It is
// not a node: it joins nothing, is offered no capability, takes no resources, and its
// connection's end changes nothing in the job. The head answers from its own books (it asks no
// other node), so a status request costs the job one small message.
//
// What is measured where: each node reports its process's CPU use over its last heartbeat
// interval and every hosted actor's mailbox depth (calls that arrived and have not returned,
// queued or running) with each heartbeat; the head samples its own on the same schedule. So the
// figures are at most one heartbeat interval (--heartbeat-ms, 500 ms) old; loadAgeMs says how old.

#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/actor.h"
#include "troupe/loop.h"

namespace troupe {

struct StatusNode {
  NodeInfo info;      // host, group, instance type, address, size, as the node reported them
  uint32_t pid = 0;   // the head's; 0 for the others
  std::string state;  // "alive", "lost" or "expected" (has not joined yet)
  bool head = false;
  int64_t heartbeatAgeMs = -1;  // since its last heartbeat; -1 for the head and expected nodes
  bool loadKnown = false;       // false until its first heartbeat (the head's: its first check)
  double cpuPercent = 0;        // its process's CPU use, % of one core (200 = two cores busy) ...
  uint32_t cpuIntervalMs = 0;   // ... over this interval
  uint32_t loopHolds = 0;       // actor method bodies that held its event loop past
                                // --stall-warn-ms, over the job
  uint32_t longestHoldMs = 0;   // the longest, and whose: "'consumer' (probe.Probe #3) in
  std::string longestHoldBy;    // Probe.work"
  int64_t loadAgeMs = -1;       // how old the load figures are
  std::string why;              // why the head declared it lost
};

struct StatusGroup {
  std::string name, instanceType;
  std::vector<std::string> hosts;
  uint32_t alive = 0;  // how many of `hosts` are alive nodes
};

struct StatusActor {
  ActorAddress address;      // id, name, type, host, group; incarnation: 1, then one per restart
  std::string state;         // "starting" (its node has not reported it yet), "running", "stopping"
  int64_t mailbox = -1;      // calls queued + running at its node's last report; -1: not reported
  uint64_t parent = 0;       // 0: the driver
};

struct JobStatus {
  std::string head, headAddress;
  std::string phase;  // "forming" (waiting for nodes), "running" (the driver runs), "ending"
  uint64_t uptimeMs = 0;
  std::vector<StatusNode> nodes;    // by host; expected nodes last
  std::vector<StatusGroup> groups;  // by name
  std::vector<StatusActor> actors;  // by id (start order)
};

struct StatusRequest {
  std::string address;        // "ip:port" of the head; a worker's works too (it names its head)
  std::string secret;         // the job secret
  bool insecure = false;      // the job runs with --insecure: plaintext, the secret in the request
  unsigned timeoutMs = 5000;  // for the whole exchange: connecting, the handshake, the answer
};

class StatusError : public std::runtime_error {
  // Why no status came back; code() is the exit code `troupe status` ends with:
  // AUTH_FAILED (the job holds another secret), JOIN_FAILED (nothing answered at the address, or
  // not in time), CONFIG_ERROR (a bad address).
 public:
  StatusError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

JobStatus fetchStatus(EventLoop& loop, const StatusRequest& request);
// Connects to `request.address`, proves the secret, and returns the head's snapshot; when the
// address is a worker's, asks the head it names. Throws StatusError.

}  // namespace troupe
