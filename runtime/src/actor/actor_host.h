// What an actor's context needs from the node that hosts it: the narrow interface between the
// actor code (actor.cpp) and the node (node.cpp), which implements it, so that neither includes
// the other's private header. Private to the runtime.

#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "troupe.capnp.h"
#include "troupe/actor.h"
#include "troupe/run_options.h"
#include "troupe/sagemaker.h"

namespace troupe {

inline int64_t steadyMicros() {
  // The steady clock in microseconds: how long a method body held the loop (loopHeld()).
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class ActorHost {
 public:
  virtual const NodeInfo& info() const = 0;
  virtual EventLoop& loop() = 0;
  virtual const RunOptions& options() const = 0;
  virtual const SageMakerEnv& sagemaker() const = 0;  // what run() loaded for this process
  virtual proto::Cluster::Client cluster() = 0;
  // The head's Cluster capability (local on the head).
  virtual proto::Node::Client peerNode(const std::string& address) = 0;
  // The Node capability of the node listening at `address` (or this node itself).
  virtual void actorExited(uint64_t id, Exit reason) = 0;
  // The actor ended by itself: tell the head.
  virtual void loopHeld(const ActorAddress& actor, const std::string& method, int64_t heldUs) = 0;
  // An actor method's body held the event loop for `heldUs` (past --stall-warn-ms): a warning
  // naming it (rate-limited), a span with --trace, and a line in `troupe status`.
  virtual void methodEntered(const ActorAddress& actor, const std::string* method) = 0;
  // The method whose body runs now (for a hold that no method body accounts for: the last one
  // to start may have held the loop in a continuation). `method` lives as long as the process.
  virtual uint32_t latestIncarnation(uint64_t id) const = 0;
  // The newest incarnation of actor `id` the head has said it restarted as (0: none): a
  // reference to an older one asks the head before its next call (rebind.h).

 protected:
  ~ActorHost() = default;
};

kj::Promise<Exit> monitorThrough(
    proto::Cluster::Client cluster, uint64_t id,
    kj::Maybe<kj::Function<void(const Restarted&)>> onRestart = nullptr);
// Monitors `id` through the head with a local Watcher: resolves with the final exit, calling
// `onRestart` for each restart before it.

kj::Duration stopDeadlineOf(const SpawnOptions& options, const RunOptions& run);
// The options' stop deadline, else the instance's --stop-timeout-ms.

}  // namespace troupe
