#include "troupe/dataset/epoch.h"

#include <algorithm>
#include <string>
#include <utility>

namespace troupe::data {
namespace {

// splitmix64: tiny, fast, fully specified, so the same seed gives the same permutation on every
// platform and standard library.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Unbiased value in [0, bound) by rejection (bound > 0).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % bound;
  }
};

}  // namespace

uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c) {
  SplitMix64 g{a};
  g.state ^= SplitMix64{b + 0x632be59bd9b4e019ull}.next();
  g.state ^= SplitMix64{c + 0x85157af5ull}.next() * 3;
  return g.next();
}

std::vector<uint32_t> shardIndices(size_t sampleCount, uint32_t shardIndex, uint32_t shardCount) {
  if (shardCount == 0) throw DatasetError("shard count is 0; it must be at least 1");
  if (shardIndex >= shardCount) {
    throw DatasetError("shard index " + std::to_string(shardIndex) + " is out of range for " +
                       std::to_string(shardCount) + " shards (0.." +
                       std::to_string(shardCount - 1) + ")");
  }
  if (shardCount > sampleCount) {
    throw DatasetError("shard count " + std::to_string(shardCount) + " exceeds the " +
                       std::to_string(sampleCount) +
                       " samples; some shards would be empty, use fewer data actors");
  }
  const size_t begin = sampleCount * shardIndex / shardCount;
  const size_t end = sampleCount * (size_t(shardIndex) + 1) / shardCount;
  std::vector<uint32_t> out(end - begin);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint32_t(begin + i);
  return out;
}

std::vector<uint32_t> epochOrder(std::span<const uint32_t> shard, uint64_t seed, uint64_t epoch) {
  std::vector<uint32_t> out(shard.begin(), shard.end());
  SplitMix64 g{mixSeed(seed, epoch)};
  for (size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[g.below(i)]);  // Fisher-Yates
  return out;
}

uint64_t BatchedEpoch::rounds() const {
  return samples / batchSize / std::max<uint32_t>(ranks, 1);
}

uint64_t BatchedEpoch::rest() const {
  if (ranks <= 1 || dropLast) return 0;
  uint64_t left = samples - rounds() * ranks * batchSize;
  return left >= ranks ? left : 0;  // fewer than one sample a rank: left out
}

uint64_t BatchedEpoch::used() const {
  if (ranks <= 1) return dropLast ? samples / batchSize * batchSize : samples;
  uint64_t r = rest();
  return rounds() * batchSize + (r * (rank + 1) / ranks - r * rank / ranks);
}

uint64_t BatchedEpoch::dropped() const {
  if (ranks <= 1) return samples - used();
  return samples - rounds() * ranks * batchSize - rest();
}

void BatchedEpoch::check() const {
  if (ranks == 0 || rank >= ranks) {
    throw DatasetError("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                       ": the rank must be below the number of ranks");
  }
  if (used() == 0) {
    throw DatasetError(std::to_string(samples) + " samples in batches of " +
                       std::to_string(batchSize) + (dropLast ? " with drop_last" : "") +
                       " leave rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                       " no batch: use a smaller batch size" +
                       (ranks > 1 ? " or fewer ranks" : ""));
  }
}

std::pair<uint64_t, uint64_t> BatchedEpoch::shardPositions(uint32_t shard, uint32_t shards) const {
  auto n = batches();
  if (shards == 0 || shard >= shards || shards > n) {
    throw DatasetError("shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                       " over " + std::to_string(n) + " batches of " + std::to_string(batchSize) +
                       ": every shard needs a batch");
  }
  uint64_t first = n * shard / shards * batchSize;
  uint64_t last = std::min(used(), n * (shard + 1) / shards * batchSize);
  return {first, last};
}

std::vector<uint32_t> BatchedEpoch::share(std::span<const uint32_t> all) const {
  if (ranks <= 1) return {all.begin(), all.end()};
  std::vector<uint32_t> out;
  out.reserve(used());
  const uint64_t b = batchSize;
  for (uint64_t j = 0; j < rounds(); ++j) {
    auto first = all.begin() + (rank + j * ranks) * b;
    out.insert(out.end(), first, first + b);
  }
  uint64_t r = rest(), base = rounds() * ranks * b;
  out.insert(out.end(), all.begin() + base + r * rank / ranks,
             all.begin() + base + r * (rank + 1) / ranks);
  return out;
}

std::vector<uint32_t> BatchedEpoch::order(uint64_t seed, uint64_t epoch) const {
  std::vector<uint32_t> all(samples);
  for (uint64_t i = 0; i < samples; ++i) all[i] = uint32_t(i);
  if (shuffle) all = epochOrder(all, seed, epoch);
  return ranks <= 1 ? all : share(all);
}

EpochCursor::EpochCursor(std::vector<uint32_t> shard, uint64_t seed, CursorState state)
    : shard_(std::move(shard)),
      seed_(seed),
      epoch_(state.epoch),
      order_(epochOrder(shard_, seed, state.epoch)),
      handedOut_(state.acknowledged),
      acknowledged_(state.acknowledged) {
  if (state.acknowledged > order_.size()) {
    throw DatasetError("cannot restore cursor at position " + std::to_string(state.acknowledged) +
                       " of epoch " + std::to_string(state.epoch) + ": the shard has only " +
                       std::to_string(order_.size()) + " samples");
  }
}

CursorBatch EpochCursor::next(size_t maxSamples) {
  if (maxSamples == 0) throw DatasetError("EpochCursor::next: maxSamples must be at least 1");
  CursorBatch batch;
  batch.epoch = epoch_;
  batch.begin = handedOut_;
  const uint64_t end = std::min<uint64_t>(order_.size(), handedOut_ + maxSamples);
  batch.samples.assign(order_.begin() + handedOut_, order_.begin() + end);
  handedOut_ = end;
  return batch;
}

void EpochCursor::acknowledge(uint64_t epoch, uint64_t position) {
  if (epoch < epoch_) return;  // Late message from an epoch we already completed.
  if (epoch > epoch_) {
    throw DatasetError("acknowledgement for epoch " + std::to_string(epoch) +
                       " but the cursor is in epoch " + std::to_string(epoch_));
  }
  if (position > handedOut_) {
    throw DatasetError("acknowledgement of position " + std::to_string(position) + " in epoch " +
                       std::to_string(epoch) + " but only " + std::to_string(handedOut_) +
                       " samples were handed out");
  }
  if (position > acknowledged_) acknowledged_ = position;
}

void EpochCursor::startNextEpoch() {
  if (!complete()) {
    throw DatasetError("cannot start epoch " + std::to_string(epoch_ + 1) + ": epoch " +
                       std::to_string(epoch_) + " has " + std::to_string(acknowledged_) + " of " +
                       std::to_string(order_.size()) + " samples acknowledged");
  }
  ++epoch_;
  order_ = epochOrder(shard_, seed_, epoch_);
  handedOut_ = 0;
  acknowledged_ = 0;
}

}  // namespace troupe::data
