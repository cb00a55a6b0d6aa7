#include "crypto_threads.h"

#include <kj/debug.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

namespace {

struct Threads {
  std::mutex mutex;
  std::vector<kj::Own<const kj::Executor>> executors;
  size_t next = 0;
};

Threads& threads() {
  static Threads* all = new Threads;  // never destroyed: its threads live as long as the process
  return *all;
}

kj::Own<const kj::Executor> startThread() {
  std::promise<kj::Own<const kj::Executor>> started;
  auto executor = started.get_future();
  // Detached: the thread waits on its own event loop for work until the process exits, and
  // holds nothing of a stream between two jobs.
  std::thread([&started]() {
    kj::EventLoop loop;
    kj::WaitScope waitScope(loop);
    started.set_value(kj::getCurrentThreadExecutor().addRef());
    kj::NEVER_DONE.wait(waitScope);
  }).detach();
  return executor.get();
}

}  // namespace

const kj::Executor& CryptoThreads::pick() {
  auto& all = threads();
  std::lock_guard<std::mutex> lock(all.mutex);
  size_t wanted = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMaxThreads);
  if (all.executors.size() < wanted) {
    all.executors.push_back(startThread());
    return *all.executors.back();
  }
  return *all.executors[all.next++ % all.executors.size()];
}

namespace {
std::atomic<int> sealForced{-1};  // -1: the CPUs decide
}

bool CryptoThreads::sealElsewhere() {
  int forced = sealForced.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  static const bool spare = std::thread::hardware_concurrency() >= kSealElsewhereCpus;
  return spare;
}

void CryptoThreads::sealElsewhere(kj::Maybe<bool> forced) {
  int value = -1;
  KJ_IF_MAYBE(f, forced) {
    value = *f ? 1 : 0;
  }
  sealForced.store(value, std::memory_order_relaxed);
}

size_t CryptoThreads::started() {
  auto& all = threads();
  std::lock_guard<std::mutex> lock(all.mutex);
  return all.executors.size();
}

}  // namespace troupe
