#include "trace/trace_collect.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "troupe/log.h"

namespace troupe {

void fillTraceChunk(const trace::Snapshot& spans, uint64_t from, uint32_t max,
                    proto::TraceChunk::Builder out) {
  size_t begin = std::min<uint64_t>(from, spans.events.size());
  size_t end = std::min<uint64_t>(begin + max, spans.events.size());
  auto list = out.initEvents(end - begin);
  for (size_t i = begin; i < end; ++i) {
    auto& e = spans.events[i];
    auto b = list[i - begin];
    b.setName(e.name);
    b.setCategory(e.category);
    b.setRow(e.row);
    b.setStart(e.start);
    b.setDuration(e.duration);
  }
  if (from == 0) {
    auto rows = out.initRows(spans.rows.size());
    for (size_t i = 0; i < spans.rows.size(); ++i) {
      rows[i].setRow(spans.rows[i].first);
      rows[i].setName(spans.rows[i].second);
    }
  }
  out.setTotal(spans.events.size());
  out.setDropped(spans.dropped);
  out.setCapacity(spans.capacity);
}

// =======================================================================================

struct TraceCollector::Source {
  std::string host, group;
  uint32_t nodeId = 0;
  trace::Snapshot spans;
  uint64_t total = 0;       // spans the node holds; spans.events.size() once all arrived
  std::string missing;      // why this host's spans are absent or incomplete; "" if complete
  bool aligned = false;     // offset measured (the head's own: trivially)
  int64_t offset = 0;       // the node's clock minus the head's, microseconds
  int64_t uncertainty = 0;  // half the best probe's round trip
  int64_t bestRoundTrip = INT64_MAX;
};

TraceCollector::TraceCollector(kj::Timer& timer, std::string path)
    : timer_(timer), path_(kj::mv(path)) {}
TraceCollector::~TraceCollector() noexcept(false) {}

const char* TraceCollector::intern(kj::StringPtr text) {
  return names_.emplace(text.cStr()).first->c_str();
}

void TraceCollector::addHead(std::string host, std::string group, uint32_t nodeId) {
  auto s = std::make_unique<Source>();
  s->host = kj::mv(host);
  s->group = kj::mv(group);
  s->nodeId = nodeId;
  s->spans = trace::snapshot();
  s->total = s->spans.events.size();
  s->aligned = true;
  sources_.push_back(kj::mv(s));
}

void TraceCollector::addMissing(std::string host, std::string group, std::string why) {
  auto s = std::make_unique<Source>();
  s->host = kj::mv(host);
  s->group = kj::mv(group);
  s->missing = kj::mv(why);
  sources_.push_back(kj::mv(s));
}

kj::Promise<void> TraceCollector::collect(std::string host, std::string group, uint32_t nodeId,
                                          proto::Node::Client node) {
  auto owned = std::make_unique<Source>();
  auto& s = *owned;
  s.host = kj::mv(host);
  s.group = kj::mv(group);
  s.nodeId = nodeId;
  sources_.push_back(kj::mv(owned));
  auto work =
      probe(s, node, kClockProbes).then([this, &s, node]() mutable { return read(s, node, 0); });
  return timer_.timeoutAfter(kCollectLimit, kj::mv(work)).catch_([&s](kj::Exception&& e) {
    s.missing = std::string("incomplete: ") + e.getDescription().cStr();
    spdlog::warn("trace: {} ({}) sent {} of its {} spans: {}", s.host, s.group,
                 s.spans.events.size(), s.total, e.getDescription().cStr());
  });
}

kj::Promise<void> TraceCollector::probe(Source& s, proto::Node::Client node, int left) {
  // NTP's estimate: the node read its clock halfway through the round trip, give or take half of
  // it; the fastest round trip of a few bounds that best.
  int64_t sent = trace::now();
  return node.traceClockRequest().send().then(
      [this, &s, node, left, sent](auto reply) mutable -> kj::Promise<void> {
        int64_t received = trace::now();
        int64_t roundTrip = received - sent;
        if (roundTrip < s.bestRoundTrip) {
          s.bestRoundTrip = roundTrip;
          s.offset = reply.getMicros() - (sent + roundTrip / 2);
          s.uncertainty = (roundTrip + 1) / 2;
          s.aligned = true;
        }
        if (left > 1) return probe(s, kj::mv(node), left - 1);
        return kj::READY_NOW;
      });
}

kj::Promise<void> TraceCollector::read(Source& s, proto::Node::Client node, uint64_t from) {
  auto req = node.traceReadRequest();
  req.setFrom(from);
  req.setMax(kChunkSpans);
  return req.send().then([this, &s, node, from](auto reply) mutable -> kj::Promise<void> {
    auto chunk = reply.getChunk();
    s.total = chunk.getTotal();
    s.spans.dropped = chunk.getDropped();
    s.spans.capacity = chunk.getCapacity();
    for (auto row : chunk.getRows()) s.spans.rows.emplace_back(row.getRow(), row.getName());
    auto events = chunk.getEvents();
    for (auto e : events) {
      s.spans.events.push_back(trace::Event{intern(e.getName()), intern(e.getCategory()),
                                            e.getRow(), e.getStart(),
                                            std::max<int64_t>(0, e.getDuration())});
    }
    uint64_t next = from + events.size();
    if (events.size() == 0 || next >= s.total) return kj::READY_NOW;
    return read(s, kj::mv(node), next);
  });
}

// =======================================================================================
// Writing

namespace {

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

struct Placed {
  const trace::Event* event;
  uint64_t tid;
};

// Chrome's complete ("X") events on one row must nest. Overlapping calls of one actor (two
// produce() streams, say) do not, so each span goes to the first lane of its row where it nests,
// and lanes past the first become rows of their own ("... (overlap 2)").
std::vector<Placed> assignLanes(std::vector<const trace::Event*> spans, uint64_t row,
                                const std::string& rowName, uint64_t& nextTid,
                                std::map<uint64_t, std::string>& extraRows) {
  std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) {
    return a->start != b->start ? a->start < b->start : a->duration > b->duration;
  });
  std::vector<std::vector<int64_t>> lanes;  // per lane, the ends of the spans still open
  std::vector<uint64_t> laneTid;
  std::vector<Placed> out;
  for (auto* e : spans) {
    int64_t end = e->start + e->duration;
    size_t lane = 0;
    for (; lane < lanes.size(); ++lane) {
      auto& open = lanes[lane];
      while (!open.empty() && open.back() <= e->start) open.pop_back();
      if (open.empty() || open.back() >= end) break;
    }
    if (lane == lanes.size()) {
      lanes.emplace_back();
      laneTid.push_back(lane == 0 ? row : nextTid++);
      if (lane > 0)
        extraRows[laneTid.back()] = rowName + " (overlap " + std::to_string(lane + 1) + ")";
    }
    lanes[lane].push_back(end);
    out.push_back({e, laneTid[lane]});
  }
  return out;
}

}  // namespace

bool TraceCollector::write() {
  std::sort(sources_.begin(), sources_.end(), [](auto& a, auto& b) { return a->host < b->host; });
  // Times in the file: microseconds on the head's clock since the first span.
  int64_t origin = INT64_MAX;
  for (auto& s : sources_) {
    for (auto& e : s->spans.events) origin = std::min(origin, e.start - s->offset);
  }
  if (origin == INT64_MAX) origin = 0;

  FILE* f = fopen(path_.c_str(), "w");
  if (f == nullptr) {
    spdlog::error("trace: cannot write '{}' ({}); check that its folder exists and is writable",
                  path_, strerror(errno));
    return false;
  }
  std::string out;
  out.reserve(1 << 20);
  bool first = true;
  auto emit = [&](const std::string& line) {
    out += first ? "\n" : ",\n";
    first = false;
    out += line;
    if (out.size() > (1 << 20)) {
      fwrite(out.data(), 1, out.size(), f);
      out.clear();
    }
  };
  out += "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  uint64_t spans = 0, dropped = 0;
  std::string hosts, missing;
  int pid = 0;
  for (auto& s : sources_) {
    ++pid;
    auto process = s->host + " (" + s->group + ")";
    auto meta = [&](const char* name, uint64_t tid, const std::string& args) {
      emit("{\"ph\":\"M\",\"name\":\"" + std::string(name) + "\",\"pid\":" + std::to_string(pid) +
           ",\"tid\":" + std::to_string(tid) + ",\"args\":{" + args + "}}");
    };
    meta("process_name", 0, "\"name\":" + quoted(process));
    meta("process_sort_index", 0, "\"sort_index\":" + std::to_string(pid));
    std::map<uint64_t, std::string> rowNames(s->spans.rows.begin(), s->spans.rows.end());
    std::map<uint64_t, std::vector<const trace::Event*>> byRow;
    for (auto& e : s->spans.events) byRow[e.row].push_back(&e);
    uint64_t nextTid = 20'000'000;
    std::map<uint64_t, std::string> extraRows;
    for (auto& [row, list] : byRow) {
      auto name = rowNames.count(row) ? rowNames[row] : "thread " + std::to_string(row);
      rowNames[row] = name;
      for (auto& p : assignLanes(list, row, name, nextTid, extraRows)) {
        auto& e = *p.event;
        std::string args =
            row >= trace::actorRow(0) ? ",\"args\":{\"actor\":" + quoted(name) + "}" : "";
        emit("{\"ph\":\"X\",\"name\":" + quoted(e.name) + ",\"cat\":" + quoted(e.category) +
             ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(p.tid) +
             ",\"ts\":" + std::to_string(e.start - s->offset - origin) +
             ",\"dur\":" + std::to_string(e.duration) + args + "}");
      }
    }
    rowNames.insert(extraRows.begin(), extraRows.end());
    for (auto& [row, name] : rowNames) {
      // Every actor gets its row; a thread only when it did something (the loop's own is empty).
      if (byRow.count(row) || extraRows.count(row) || row >= trace::actorRow(0)) {
        meta("thread_name", row, "\"name\":" + quoted(name));
      }
    }
    spans += s->spans.events.size();
    dropped += s->spans.dropped;
    if (!hosts.empty()) hosts += ",";
    hosts += "{\"host\":" + quoted(s->host) + ",\"group\":" + quoted(s->group) +
             ",\"pid\":" + std::to_string(pid) +
             ",\"spans\":" + std::to_string(s->spans.events.size()) +
             ",\"dropped\":" + std::to_string(s->spans.dropped) +
             ",\"buffer_spans_per_thread\":" + std::to_string(s->spans.capacity) +
             ",\"clock_offset_us\":" + (s->aligned ? std::to_string(s->offset) : "null") +
             ",\"clock_uncertainty_us\":" + (s->aligned ? std::to_string(s->uncertainty) : "null") +
             ",\"complete\":" + (s->missing.empty() ? "true" : "false") + "}";
    if (!s->missing.empty()) {
      if (!missing.empty()) missing += ",";
      missing += "{\"host\":" + quoted(s->host) + ",\"group\":" + quoted(s->group) +
                 ",\"why\":" + quoted(s->missing) + "}";
    }
  }
  out +=
      "\n],\"otherData\":{\"troupe\":{\"clock\":\"every host's spans are shifted onto the "
      "head's clock by its measured offset (min-RTT probes)\",\"spans\":" +
      std::to_string(spans) + ",\"dropped_spans\":" + std::to_string(dropped) + ",\"hosts\":[" +
      hosts + "],\"missing_hosts\":[" + missing + "]}}}\n";
  fwrite(out.data(), 1, out.size(), f);
  bool ok = fflush(f) == 0 && !ferror(f);
  ok = fclose(f) == 0 && ok;
  if (!ok) {
    spdlog::error("trace: writing '{}' failed ({})", path_, strerror(errno));
    return false;
  }
  spdlog::info("trace: {} spans from {} hosts written to {}{}{}", spans, sources_.size(), path_,
               dropped ? " (" + std::to_string(dropped) + " dropped: buffers full)" : "",
               missing.empty() ? "" : "; some hosts are missing or incomplete (see otherData)");
  return true;
}

}  // namespace troupe
