// What a node asks of the head it hosts, and what a worker and its head agree on. The node owns
// this interface (as actor/ reaches the node through ActorHost): the head implements it, so the
// node never includes the head and the arrow between them points one way, head -> node.

#pragma once

#include <kj/async.h>
#include <string>

#include "troupe.capnp.h"

namespace troupe {

class Connection;

// How long the head waits before it drains a worker that was signalled (Cluster.leave): unless
// the head itself is stopped within this long, the signal was that worker's alone (a stop of the
// whole job signals every instance at about the same time). The worker waits at least this long
// for the head's word before it ends (worker.cpp).
constexpr unsigned kDrainWindowMs = 1500;
// In the head's refusal of a process that claims a live host without a higher incarnation; the
// refused process leaves that host's output/failure to the live one (run.cpp).
constexpr const char* kTwoProcesses = "two processes claim to be it";
// In the head's refusal of a host that joins as the job ends, before "NAME: reason)" of the job's
// exit code; the worker reads the code from it and ends with it (worker.cpp).
constexpr const char* kJobEnding = "cannot join: the job is ending (";

class HeadLink {
 public:
  virtual proto::Cluster::Client session(kj::Maybe<Connection&> connection) = 0;
  // The head's Cluster capability as a peer that logged in over `connection` sees it (a node that
  // joins over it is declared lost when the connection drops).
  virtual void status(proto::JobStatus::Builder out) const = 0;
  // The job for `troupe status`.
  virtual proto::Node::Client nodeAt(const std::string& address,
                                     kj::Maybe<proto::Node::Client> otherwise) = 0;
  // The head's connection to the worker at `address` (it holds one to every worker that joined).

 protected:
  ~HeadLink() = default;  // the head owns itself; no one deletes it through this interface
};

}  // namespace troupe
