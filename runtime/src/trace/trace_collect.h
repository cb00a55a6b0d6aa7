// The merged timeline (`--trace FILE`): how a node serves its spans and how the head gathers every
// node's, puts them on its own clock and writes the Chrome trace-event JSON (docs/tracing.md).
// Private to the runtime.

#pragma once

#include <kj/async.h>
#include <kj/timer.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "troupe.capnp.h"
#include "troupe/trace.h"

namespace troupe {

void fillTraceChunk(const trace::Snapshot& spans, uint64_t from, uint32_t max,
                    proto::TraceChunk::Builder out);
// The node's answer to Node.traceRead: spans [from, from + max) of `spans`, and its row names
// when `from` is 0.

class TraceCollector {
  // Gathers one job's spans on the head and writes them. Nothing here fails the job: a node that
  // does not answer within the limit contributes what it sent, and the file names it.
 public:
  TraceCollector(kj::Timer& timer, std::string path);
  ~TraceCollector() noexcept(false);
  KJ_DISALLOW_COPY(TraceCollector);

  void addHead(std::string host, std::string group, uint32_t nodeId);
  // The head's own spans (already on the head's clock).
  void addMissing(std::string host, std::string group, std::string why);
  // A host with nothing to give (lost before the end of the job, or never joined).
  kj::Promise<void> collect(std::string host, std::string group, uint32_t nodeId,
                            proto::Node::Client node);
  // Probes the node's clock, then reads its spans in chunks. Never rejects; gives up after
  // kCollectLimit.

  bool write();
  // Writes the file (Chrome's JSON object format); logs and returns false when it cannot.

  static constexpr uint32_t kChunkSpans = 20000;  // ~1 MB per Node.traceRead answer
  static constexpr kj::Duration kCollectLimit = 15 * kj::SECONDS;
  static constexpr int kClockProbes = 8;

 private:
  struct Source;

  kj::Promise<void> probe(Source& s, proto::Node::Client node, int left);
  kj::Promise<void> read(Source& s, proto::Node::Client node, uint64_t from);
  const char* intern(kj::StringPtr text);

  kj::Timer& timer_;
  std::string path_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::set<std::string> names_;  // span names and categories of remote nodes, by address
};

}  // namespace troupe
