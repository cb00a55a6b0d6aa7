// The trainer's shard queue (trainer_actor.h): which shard goes to which augmenter and when -
// memory bounded by construction (torch's rule, prefetch_factor batches per augmenter in the
// making or waiting, and a quarter of the memory available in bytes), the instance serving the
// fewest shards first, and the epoch's tail taken over from a slow augmenter.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "clock.h"
#include "trainer_actor.h"

namespace troupe::train {

uint32_t TrainerActor::streamsEach() const {
  return inOrder_ && args_.getPython() ? prefetch_ : 1;
}

uint64_t TrainerActor::streamCost(const Source& s) const {
  uint64_t batches = planned_ ? s.ends.size() : (s.expected.size() + batchSize_ - 1) / batchSize_;
  return std::max<uint64_t>(1, std::min<uint64_t>(prefetch_, batches));
}

uint64_t TrainerActor::batchMemoryBudget() {
  // A quarter of what this machine has available now (of the instance type's memory, where
  // troupe sim says it): what the other processes of the instance and the model leave.
  uint64_t available = 0;
  if (FILE* f = fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f)) {
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) available = kb * 1024;
    }
    fclose(f);
  }
  if (const char* typed = getenv("TROUPE_MEMORY_BYTES")) {
    uint64_t bytes = strtoull(typed, nullptr, 10);
    if (bytes > 0 && (available == 0 || bytes < available)) available = bytes;
  }
  return available == 0 ? ~0ull : available / 4;
}

uint64_t TrainerActor::budget() const {
  uint64_t live = 0;
  for (auto& a : augmenters_) live += !a.gone;
  uint64_t byRule = uint64_t(prefetch_) * std::max<uint64_t>(1, live);
  // Until a batch's bytes are known (a script's Dataset), a few at a time: the first batches
  // say how large they are.
  if (batchBytes_ == 0) return std::min<uint64_t>(byRule, kBeforeTheFirstBatch);
  return std::min(byRule, std::max<uint64_t>(2, memoryBudget_ / batchBytes_));
}

void TrainerActor::dispatch() {
  if (!training_ || stopping_) return;
  uint32_t each = streamsEach();
  auto free = [this, each](size_t k) {
    auto& a = augmenters_[k];
    return a.streams < each && !a.down && !a.gone;
  };
  // A free augmenter on the instance serving the fewest shards now: an epoch of few shards
  // spreads over every data instance (the first one's augmenters would take them all).
  std::map<std::string, uint32_t> serving;
  for (auto& a : augmenters_) serving[a.address.host] += a.streams;
  auto pick = [&]() -> int64_t {
    int64_t best = -1;
    for (size_t k = 0; k < augmenters_.size(); ++k) {
      if (!free(k)) continue;
      if (best < 0 ||
          std::pair(serving[augmenters_[k].address.host], augmenters_[k].streams) <
              std::pair(serving[augmenters_[best].address.host], augmenters_[best].streams)) {
        best = int64_t(k);
      }
    }
    return best;
  };
  // What the trainer holds now (queued batches, and what its streams may still push), and the
  // shard it needs next.
  uint64_t held = queue_.size();
  size_t needed = sources_.size();
  for (size_t i = 0; i < sources_.size(); ++i) {
    auto& s = sources_[i];
    if (s.augmenter >= 0) held += streamCost(s) - std::min<uint64_t>(s.queued, streamCost(s));
    if (needed == sources_.size() && s.acked < s.expected.size()) needed = i;
  }
  uint64_t most = budget();
  if (batchBytes_ > 0 && !memoryBoundSaid_ &&
      most < uint64_t(prefetch_) * std::max<size_t>(1, augmenters_.size())) {
    memoryBoundSaid_ = true;
    spdlog::info(
        "batches of {:.1f} MiB: the trainer holds at most {} of them, a quarter of the memory "
        "available ({:.1f} GiB), fewer than prefetch_factor x {} augmenters",
        batchBytes_ / 1048576.0, most, memoryBudget_ * 4 / 1073741824.0, augmenters_.size());
  }
  for (uint32_t i = 0; i < sources_.size(); ++i) {
    auto& s = sources_[i];
    if (s.produced || s.augmenter >= 0 || from(s) >= s.expected.size()) continue;
    // The rest wait until the trainer has taken some of what it holds.
    if (held + streamCost(s) > most && i != needed && held > 0) break;
    auto next = pick();
    if (next < 0) return;  // every augmenter is busy (or down)
    s.augmenter = static_cast<int32_t>(next);
    ++augmenters_[next].streams;
    ++serving[augmenters_[next].address.host];
    held += streamCost(s);
    startSource(i);
  }
  // The queue is empty (or waits for the trainer): the epoch's tail.
  for (size_t k = 0; k < augmenters_.size(); ++k) {
    if (free(k) && !augmenters_[k].slow && !steal(uint32_t(k))) return;
  }
}

bool TrainerActor::steal(uint32_t augmenter) {
  if (shardSeconds_.size() < 3) return false;
  auto sorted = shardSeconds_;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  double median = sorted[sorted.size() / 2];
  double limit = std::max(1.0, kSlowShardFactor * median);
  auto now = context().timer().now();
  int64_t best = -1;
  uint64_t mostLeft = 0;
  for (uint32_t i = 0; i < sources_.size(); ++i) {
    auto& s = sources_[i];
    bool waitedFor = false;
    if (inOrder_) {
      // The trainer takes nothing until this one's next batch is here: one batch is enough.
      if (s.acked >= s.expected.size()) continue;
      waitedFor = true;
    }
    if (s.augmenter < 0 || s.produced || s.augmenter == int32_t(augmenter) ||
        seconds(now - s.since) < limit) {
      if (waitedFor) break;
      continue;
    }
    uint64_t left = s.expected.size() - std::min<uint64_t>(s.acked, s.expected.size());
    if ((waitedFor || left >= 2ull * batchSize_) && left > mostLeft) {
      best = i;
      mostLeft = left;
    }
    if (waitedFor) break;
  }
  if (best < 0) return false;
  auto& s = sources_[best];
  auto& from = augmenters_[s.augmenter];
  auto& to = augmenters_[augmenter];
  spdlog::warn(
      "shard {}: '{}' on {} has served it for {:.1f} s (a shard takes {:.2f} s at the median); "
      "'{}' on {} takes it over from sample {}",
      s.shard, from.address.name, from.address.host, seconds(now - s.since), median,
      to.address.name, to.address.host, s.acked);
  from.slow = true;
  unassign(best);  // its stream's late batches are stale now
  s.augmenter = static_cast<int32_t>(augmenter);
  ++to.streams;
  startSource(best);
  return true;
}

}  // namespace troupe::train
