// The span recorder: one fixed-size buffer per recording thread, written only by its thread.
// A reader (snapshot()) sees a prefix of each buffer: the writer publishes a span by storing the
// new size with release order after writing it.

#include "troupe/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>

namespace troupe::trace {

namespace detail {
std::atomic<bool> on{false};
}

namespace {

constexpr uint64_t kActorRowBase = 10'000'000;  // above Linux's largest thread id (2^22)

struct Buffer {
  Buffer(size_t capacity, uint64_t row)
      : events(new Event[capacity]), capacity(capacity), row(row) {}
  std::unique_ptr<Event[]> events;
  size_t capacity;
  uint64_t row;
  std::atomic<size_t> size{0};
  std::atomic<uint64_t> dropped{0};
};

struct Recorder {
  std::mutex mutex;  // guards the fields below, never a span's recording
  std::vector<std::unique_ptr<Buffer>> buffers;  // kept until the process ends
  std::map<uint64_t, std::string> rows;
  size_t spansPerThread = 0;
  uint64_t loopThread = 0;
  unsigned poolThreads = 0;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

uint64_t linuxThreadId() {
  return static_cast<uint64_t>(syscall(SYS_gettid));
}

thread_local Buffer* current = nullptr;
thread_local uint64_t currentRow = 0;

Buffer& buffer() {
  if (current != nullptr) return *current;
  auto& r = recorder();
  uint64_t row = threadRow();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.buffers.push_back(std::make_unique<Buffer>(r.spansPerThread, row));
  if (row == r.loopThread) {
    r.rows[row] = "event loop";
  } else if (r.rows.count(row) == 0) {
    r.rows[row] = "pool thread " + std::to_string(++r.poolThreads);
  }
  current = r.buffers.back().get();
  return *current;
}

}  // namespace

int64_t now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void enable(size_t spansPerThread) {
  auto& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.spansPerThread = kj::max(spansPerThread, size_t(1));
    r.loopThread = linuxThreadId();
  }
  detail::on.store(true, std::memory_order_release);
}

uint64_t actorRow(uint64_t actorId) {
  return kActorRowBase + actorId;
}

uint64_t threadRow() {
  if (currentRow == 0) currentRow = linuxThreadId();
  return currentRow;
}

void nameRow(uint64_t row, std::string name) {
  if (!enabled()) return;
  auto& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rows[row] = kj::mv(name);
}

void record(const char* name, const char* category, uint64_t row, int64_t start, int64_t end) {
  if (!enabled()) return;
  auto& b = buffer();
  size_t n = b.size.load(std::memory_order_relaxed);
  if (n == b.capacity) {
    b.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  b.events[n] = Event{name, category, row, start, end > start ? end - start : 0};
  b.size.store(n + 1, std::memory_order_release);
}

Snapshot snapshot() {
  Snapshot s;
  auto& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  s.capacity = r.spansPerThread;
  for (auto& b : r.buffers) {
    size_t n = b->size.load(std::memory_order_acquire);
    s.events.insert(s.events.end(), b->events.get(), b->events.get() + n);
    s.dropped += b->dropped.load(std::memory_order_relaxed);
  }
  s.rows.assign(r.rows.begin(), r.rows.end());
  return s;
}

}  // namespace troupe::trace
