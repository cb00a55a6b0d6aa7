// The head: membership once the job runs. Nodes that join late or come back are announced to the
// driver (Driver::onNodeJoined); a worker that is signalled alone leaves by a drain; every change
// is logged, and summed up at the job's end (docs/lifecycle.md, "Membership").

#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "head/head.h"
#include "troupe/exit_codes.h"
#include "troupe/log.h"

namespace troupe {

void Head::membershipEvent(std::string line) {
  spdlog::info("membership: {}", line);
  membership_.push_back(kj::mv(line));
}

void Head::onNodeJoined(kj::Function<void(const NodeInfo&)> callback) {
  joinedCallbacks_.push_back(kj::mv(callback));
}

void Head::leave(uint32_t nodeId, std::string reason) {
  auto* n = findNode(nodeId);
  if (n == nullptr || !n->alive || n->draining || finishing_) return;
  spdlog::warn(
      "{}: {} asks to leave; it is drained in {} ms unless the whole job is stopped "
      "meanwhile",
      reason, nodeLine(n->info), kDrainWindowMs);
  tasks_.add(node_.loop()
                 .timer()
                 .afterDelay(kDrainWindowMs * kj::MILLISECONDS)
                 .then([this, nodeId, reason]() {
                   if (!finishing_) drain(nodeId, reason);
                 }));
}

void Head::drain(uint32_t nodeId, std::string reason) {
  auto* n = findNode(nodeId);
  if (n == nullptr || !n->alive || n->draining) return;
  n->draining = true;
  view_.setState(nodeId, sched::NodeState::LOST);  // no new placements; the books settle
  auto line = nodeLine(n->info);
  membershipEvent(line + " left (" + reason + "): drained");
  // Its actors stop (their onStop() runs: a producer ends its streams, and what it acknowledged
  // stays acknowledged) and restart elsewhere under their placements, as after a node loss.
  auto text = "node " + line + " left the job (" + reason + ")";
  kj::Vector<kj::Promise<void>> stops;  // the lost node's running actors: not all of actors_
  for (auto& [id, a] : actors_) {
    if (a.address.nodeId != nodeId || a.state != State::RUNNING) continue;
    Exit why{ExitKind::NODE_LOST, originLine(a, Exit{ExitKind::NODE_LOST, text})};
    stops.add(terminate(id, why, false, true));
  }
  tasks_.add(kj::joinPromises(stops.releaseAsArray()).then([this, nodeId, reason, line]() {
    auto* n = findNode(nodeId);
    if (n == nullptr || !n->alive || finishing_) return kj::Promise<void>(kj::READY_NOW);
    n->alive = false;
    n->left = true;
    n->lostBecause = "left the job: " + reason;
    auto req = n->client.exitRequest();
    req.setStatus(OK);
    req.setReason("drained (" + reason + "); its work goes on on the other nodes");
    spdlog::info("{} drained: its actors run elsewhere; telling it to exit 0", line);
    return node_.loop()
        .timer()
        .timeoutAfter(5 * kj::SECONDS, req.send().ignoreResult())
        .catch_([](kj::Exception&&) {})
        .then([this, nodeId]() {
          // Its control path goes quiet now: not a loss.
          if (control_) control_->fence(nodeId, "it left the job");
        });
  }));
}

}  // namespace troupe
