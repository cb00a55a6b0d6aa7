// File: troupe/trace.h
//
// Spans for the merged timeline (`--trace FILE`, docs/tracing.md). Every node records what its
// threads do into per-thread buffers; at the end of the job the head collects every node's spans,
// shifts them onto its own clock and writes one Chrome trace-event JSON file that Perfetto opens:
// one process row per host, one thread row per actor and per pool thread.
//
// Recording is off unless run() was given --trace: every recording function first tests one flag,
// so a process without --trace pays a relaxed load and a branch per span. With it, a span costs
// two clock reads and a store into this thread's own buffer (no lock, no allocation). A buffer
// holds a fixed number of spans; past that they are dropped and counted, and the file says how
// many.
//
//   { troupe::trace::Span span("augment", "train"); heavyWork(); }   // on this thread's row
//
//   return troupe::trace::around(sink.pushRequest().send(), "push", "stream",
//                                troupe::trace::actorRow(self().id));   // until it resolves
//
// The recorder is process-wide, unlike the rest of the runtime (troupe passes its context
// explicitly): spans are recorded on pool threads, inside work that has no handle on its node.

#pragma once

#include <kj/async.h>
#include <kj/common.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace troupe::trace {

namespace detail {
extern std::atomic<bool> on;
}

inline bool enabled() {
  return detail::on.load(std::memory_order_relaxed);
}
// Whether this process records spans (run() got --trace).

int64_t now();
// Microseconds on this process's monotonic clock (the clock spans are recorded in).

void enable(size_t spansPerThread);
// Starts recording, from this thread (which becomes the "event loop" row). Each thread that
// records gets a buffer of `spansPerThread` spans when it records its first one. run() calls this
// before the event loop and its pool start.

uint64_t actorRow(uint64_t actorId);
// The row (Chrome's `tid`) of an actor's timeline: its calls, stream pushes and credit waits.
uint64_t threadRow();
// The row of the calling thread (its Linux thread id).
void nameRow(uint64_t row, std::string name);
// Names a row ("'trainer' (train.Trainer #4)"); the last name given wins. Takes a lock: call it
// once per row, not per span.

void record(const char* name, const char* category, uint64_t row, int64_t start, int64_t end);
// A finished span on `row`, from `start` to `end` (now() values). `name` and `category` are kept
// by pointer: they must live as long as the process (string literals, Cap'n Proto schema names).
// Does nothing when recording is off.

class Span {
  // A span on the calling thread's row, from construction to destruction.
 public:
  Span(const char* name, const char* category)
      : name_(name), category_(category), start_(enabled() ? now() : -1) {}
  ~Span() {
    if (start_ >= 0) record(name_, category_, threadRow(), start_, now());
  }
  KJ_DISALLOW_COPY(Span);

 private:
  const char* name_;
  const char* category_;
  int64_t start_;
};

template <typename T>
kj::Promise<T> around(kj::Promise<T> promise, const char* name, const char* category, uint64_t row,
                      int64_t start = -1) {
  // `promise` with a span on `row` from `start` (-1: now) until it resolves or fails, ended before
  // whatever is chained on it runs (so a span that continuation starts comes after it). A promise
  // dropped unresolved records nothing.
  if (!enabled()) return promise;
  if (start < 0) start = now();
  auto end = [name, category, row, start]() { record(name, category, row, start, now()); };
  auto failed = [end](kj::Exception&& e) -> kj::Promise<T> {
    end();
    return kj::mv(e);
  };
  if constexpr (std::is_void_v<T>) {
    return promise.then(
        [end]() -> kj::Promise<void> {
          end();
          return kj::READY_NOW;
        },
        kj::mv(failed));
  } else {
    return promise.then(
        [end](T&& value) -> kj::Promise<T> {
          end();
          return kj::mv(value);
        },
        kj::mv(failed));
  }
}

// -- collection (the runtime's head and nodes) --

struct Event {
  const char* name;
  const char* category;
  uint64_t row;
  int64_t start;     // now() when it began
  int64_t duration;  // microseconds, >= 0
};

struct Snapshot {
  std::vector<Event> events;  // by thread, each thread's in the order they ended
  std::vector<std::pair<uint64_t, std::string>> rows;  // named rows
  uint64_t dropped = 0;   // spans not recorded because a buffer was full
  uint64_t capacity = 0;  // spans a thread's buffer holds
};

Snapshot snapshot();
// What has been recorded so far, on every thread. Safe while threads still record (their later
// spans are not in it).

}  // namespace troupe::trace
