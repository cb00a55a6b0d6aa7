// The span recorder (troupe/trace.h) and the trace file the head writes (trace_collect.h). Each
// test case runs in a process of its own (catch_discover_tests), so enabling the process-wide
// recorder in one does not leak into another.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "trace/trace_collect.h"
#include "troupe/loop.h"
#include "troupe/trace.h"

namespace trace = troupe::trace;
using nlohmann::json;

namespace {

std::string tempFile(const std::string& name) {
  return "/tmp/troupe-trace-test-" + std::to_string(getpid()) + "-" + name;
}

json writeHeadTrace(troupe::EventLoop& loop, const std::string& missingHost = "") {
  auto path = tempFile("trace.json");
  troupe::TraceCollector collector(loop.timer(), path);
  collector.addHead("algo-1", "dnn_group", 1);
  if (!missingHost.empty()) collector.addMissing(missingHost, "data_group", "lost: test");
  REQUIRE(collector.write());
  std::ifstream in(path);
  auto j = json::parse(in);
  unlink(path.c_str());
  return j;
}

}  // namespace

TEST_CASE("trace: nothing is recorded without enable()", "[trace]") {
  CHECK_FALSE(trace::enabled());
  trace::record("x", "test", trace::threadRow(), 1, 2);
  { trace::Span span("y", "test"); }
  auto s = trace::snapshot();
  CHECK(s.events.empty());  // the one flag is off: no buffer, no span
  CHECK(s.dropped == 0);
}

TEST_CASE("trace: a full buffer drops spans and counts them", "[trace]") {
  trace::enable(4);
  for (int i = 0; i < 10; ++i) trace::record("x", "test", trace::threadRow(), i, i + 1);
  auto s = trace::snapshot();
  CHECK(s.events.size() == 4);  // bounded memory: the buffer's capacity
  CHECK(s.dropped == 6);        // and said so
  CHECK(s.capacity == 4);
}

TEST_CASE("trace: each thread records into its own buffer and row", "[trace]") {
  trace::enable(100);
  { trace::Span span("main", "test"); }
  uint64_t otherRow = 0;
  std::thread other([&] {
    for (int i = 0; i < 5; ++i) trace::Span span("other", "test");
    otherRow = trace::threadRow();
  });
  other.join();
  auto s = trace::snapshot();
  REQUIRE(s.events.size() == 6);
  std::map<std::string, int> byName;
  for (auto& e : s.events) {
    ++byName[e.name];
    CHECK(e.duration >= 0);
    CHECK(e.row == (std::string(e.name) == "other" ? otherRow : trace::threadRow()));
  }
  CHECK(byName["main"] == 1);
  CHECK(byName["other"] == 5);
  std::map<uint64_t, std::string> rows(s.rows.begin(), s.rows.end());
  CHECK(rows[trace::threadRow()] == "event loop");  // the thread that called enable()
  CHECK(rows[otherRow] == "pool thread 1");
}

TEST_CASE("trace: around() spans a promise on an actor's row until it resolves", "[trace]") {
  trace::enable(100);
  troupe::EventLoop loop;
  auto paf = kj::newPromiseAndFulfiller<int>();
  auto row = trace::actorRow(7);
  auto traced = trace::around(kj::mv(paf.promise), "call", "actor", row);
  CHECK(trace::snapshot().events.empty());  // not before it resolves
  paf.fulfiller->fulfill(42);
  CHECK(traced.wait(loop.waitScope()) == 42);  // the value passes through
  auto s = trace::snapshot();
  REQUIRE(s.events.size() == 1);
  CHECK(std::string(s.events[0].name) == "call");
  CHECK(s.events[0].row == row);
}

TEST_CASE("trace: the file nests every row, names every process and the missing hosts", "[trace]") {
  trace::enable(100);
  troupe::EventLoop loop;
  auto row = trace::actorRow(3);
  trace::nameRow(row, "'augmenter-0' train.Augmenter #3");
  trace::record("produce", "actor", row, 1000, 9000);       // the long stream
  trace::record("credit wait", "stream", row, 2000, 4010);  // ended by the grant below
  trace::record("grant", "actor", row, 4000, 4020);         // overlaps without nesting
  auto j = writeHeadTrace(loop, "algo-2");

  std::map<int64_t, std::string> threads;
  std::map<std::string, int64_t> tidOf;
  std::set<std::string> processes;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"]);
    if (e["ph"] == "X") {
      tidOf[e["name"]] = e["tid"];
      CHECK(e["args"]["actor"] == "'augmenter-0' train.Augmenter #3");
    }
  }
  CHECK(processes == std::set<std::string>{"algo-1 (dnn_group)", "algo-2 (data_group)"});
  // produce and credit wait nest on the actor's row; the grant goes to a row of its own.
  CHECK(tidOf["produce"] == int64_t(row));
  CHECK(tidOf["credit wait"] == int64_t(row));
  CHECK(tidOf["grant"] != int64_t(row));
  CHECK(threads[tidOf["grant"]] == "'augmenter-0' train.Augmenter #3 (overlap 2)");
  auto& meta = j["otherData"]["troupe"];
  REQUIRE(meta["missing_hosts"].size() == 1);
  CHECK(meta["missing_hosts"][0]["host"] == "algo-2");
  CHECK(meta["missing_hosts"][0]["why"] == "lost: test");
  CHECK(meta["hosts"][0]["clock_offset_us"] == 0);  // the head's own clock
  CHECK(meta["spans"] == 3);
}
