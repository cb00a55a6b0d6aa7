// The head: the end of the job: the cascade, telling every node to exit, the trace.

#include "head/head.h"

#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "trace/trace_collect.h"
#include "troupe/exit_codes.h"
#include "troupe/log.h"

namespace troupe {

// =======================================================================================
// The end of the job

void Head::finish(int code, std::string reason) {
  if (finishing_) return;
  finishing_ = true;
  code_ = code;
  reason_ = reason;
  if (code == OK) {
    spdlog::info("job finished: {}", reason);
  } else {
    // The one line that says what failed, where, and why.
    spdlog::error("job failed ({}): {}", exitCodeName(code), firstLine(reason));
  }
  spdlog::info("actors started: {}, with {} bytes of spawn arguments sent from the head", hosted_,
               hostedArgBytes_);
  if (!membership_.empty()) {
    std::string all;
    for (auto& m : membership_) all += (all.empty() ? "" : "; ") + m;
    spdlog::info("membership changes during the job: {}", all);
  }
  tasks_.add(kj::evalLater([this]() {
    // Cancel the driver (outside of its own continuation).
    driverTask_ = nullptr;
    return endJob();
  }));
}

void Head::onJobEnd(kj::Function<void(const JobEnd&)> callback) {
  endCallbacks_.push_back(kj::mv(callback));
}

// The driver's end callbacks, once, in the order they were added; one that throws is logged and
// the next still runs.
void Head::callEndCallbacks() {
  auto callbacks = kj::mv(endCallbacks_);
  JobEnd end{code_, reason_};
  for (auto& callback : callbacks) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { callback(end); })) {
      spdlog::error("a job-end callback (Driver::onJobEnd) failed: {}", e->getDescription().cStr());
    }
  }
}

kj::Promise<void> Head::endJob() {
  // 1. The cascade: stop the driver's actors, newest first, each with its subtree.
  std::vector<uint64_t> roots(rootChildren_.rbegin(), rootChildren_.rend());
  kj::Promise<void> chain = kj::READY_NOW;
  for (auto id : roots) {
    chain = chain.then(
        [this, id]() { return terminate(id, Exit::shutdown("the job is ending"), false, false); });
  }
  // 2. The driver's end callbacks (Driver::onJobEnd): what its actors wrote as they stopped is
  //    there to read.
  // 3. With --trace, the spans of every node, while they all still run (troupe/trace.h).
  // 4. Every other node stops what it still hosts and exits with the job's status.
  return chain.then([this]() { callEndCallbacks(); })
      .then([this]() { return collectTrace(); })
      .then([this]() {
        // A Vector, not a heapArrayBuilder of nodes_.size(): the head and lost nodes are left
        // out, and a builder's finish() short of its size is a KJ_IREQUIRE failure (it threw
        // where KJ's debug checks are on, -O0, and the head never exited).
        kj::Vector<kj::Promise<void>> exits(nodes_.size());
        for (auto& [id, n] : nodes_) {
          if (id == 1 || !n.alive) continue;
          auto req = n.client.exitRequest();
          req.setStatus(code_);
          req.setReason(reason_);
          exits.add(node_.loop()
                        .timer()
                        .timeoutAfter(5 * kj::SECONDS, req.send().ignoreResult())
                        .catch_([](kj::Exception&&) {}));
        }
        return kj::joinPromises(exits.releaseAsArray());
      })
      // 5. The head exits last.
      .then([this]() { return node_.stopAll(Exit::shutdown("the job is ending")); })
      .then([this]() {
        node_.requestExit(code_, reason_);
        finishFulfiller_->fulfill();
      });
}

kj::Promise<void> Head::collectTrace() {
  auto& path = node_.options().traceFile;
  if (path.empty()) return kj::READY_NOW;
  auto collector = kj::heap<TraceCollector>(node_.loop().timer(), path);
  kj::Vector<kj::Promise<void>> reads(nodes_.size());  // the live nodes but the head
  std::set<std::string> joined;
  for (auto& [id, n] : nodes_) {
    std::string host = n.info.host().cStr(), group = n.info.group().cStr();
    joined.insert(host);
    if (id == 1) {
      collector->addHead(host, group, id);
    } else if (!n.alive) {
      collector->addMissing(host, group, "lost before the end of the job: " + n.lostBecause);
    } else {
      reads.add(collector->collect(host, group, id, n.client));
    }
  }
  for (auto& g : node_.config().groups) {
    for (auto& h : g.hosts) {
      if (!joined.count(h)) collector->addMissing(h, g.name, "never joined the cluster");
    }
  }
  auto& c = *collector;
  return kj::joinPromises(reads.releaseAsArray())
      .then([&c]() { c.write(); })
      .catch_([](kj::Exception&& e) {
        spdlog::error("trace: not written: {}", e.getDescription().cStr());
      })
      .attach(kj::mv(collector));
}

}  // namespace troupe
