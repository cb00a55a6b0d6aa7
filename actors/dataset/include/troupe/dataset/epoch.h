// File: troupe/dataset/epoch.h
//
// Which samples a producer hands out, in which order, and how far it got. Three pieces:
//
//   * shardIndices: the sample ids that belong to data actor `index` of `count`;
//   * epochOrder: a seeded per-epoch permutation of a shard (same seed and epoch -> same order
//     on every machine, each sample exactly once);
//   * EpochCursor: walks that order in batches, remembering what has been handed out and what
//     the consumer has acknowledged, so that a producer restarted from the acknowledged position
//     completes the epoch delivering every sample exactly once.
//
// Positions are offsets into the epoch order (0..shard size), not sample ids. Acknowledgements are
// cumulative, like TCP: acknowledging position p means every sample before p was consumed. The
// consumer (the trainer) is the one that knows what it consumed, so it owns the acknowledged
// position and hands it to a replacement producer; samples handed out after it are sent again.

#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "troupe/dataset/fashion_mnist.h"

namespace troupe::data {

/// The sample ids of shard `shardIndex` of `shardCount` over `sampleCount` samples: a contiguous
/// range, sizes differing by at most one, the shards together covering every id exactly once.
/// Throws DatasetError when shardCount is 0, shardIndex >= shardCount, or shardCount >
/// sampleCount (a shard would be empty, which always means a misconfigured group size).
std::vector<uint32_t> shardIndices(size_t sampleCount, uint32_t shardIndex, uint32_t shardCount);

/// `shard` permuted for `epoch`, deterministically from (seed, epoch) with a portable generator
/// (not std::uniform_int_distribution, whose output differs between standard libraries).
std::vector<uint32_t> epochOrder(std::span<const uint32_t> shard, uint64_t seed, uint64_t epoch);

/// How an epoch is cut, as torch's DataLoader cuts it: the epoch's order of every sample
/// (shuffled from (seed, epoch), or 0..N-1 in order), batch k its positions [k*B, (k+1)*B), every
/// batch whole but the epoch's last, which is short or, with dropLast, left out. A shard is a
/// contiguous run of whole batches, so batch k holds the same samples whichever shard, augmenter
/// or instance serves it. (hetero_train's Fashion-MNIST path cuts per shard instead: shardIndices
/// and epochOrder.)
///
/// Several ranks (DDP: `ranks` trainers, this one `rank`) share the epoch with the same number of
/// batches each, as DDP's steps must be: rank r takes the epoch's whole batches r, r + R, r + 2R,
/// ... for as many full rounds of R as there are; what is left after them (fewer than R whole
/// batches and the short one) is split evenly, each rank's last batch a short one of it. With
/// dropLast that rest is left out; so are the under R samples of a rest too small to give every
/// rank one (dropped(): counted as torch's drop_last counts, not as missing). Every other sample
/// is one rank's, once.
struct BatchedEpoch {
  uint64_t samples = 0;
  uint32_t batchSize = 1;
  bool shuffle = true;
  bool dropLast = false;
  uint32_t rank = 0;
  uint32_t ranks = 1;

  /// Positions this rank trains per epoch: every sample, or with dropLast those of whole
  /// batches; of several ranks, its share.
  uint64_t used() const;
  uint64_t batches() const { return (used() + batchSize - 1) / batchSize; }
  /// Samples of the epoch that no rank trains (drop_last's, and a rest smaller than ranks).
  uint64_t dropped() const;
  /// Shard `shard` of `shards`: its positions [first, second) in the rank's order. Throws
  /// DatasetError when a shard would hold no batch.
  std::pair<uint64_t, uint64_t> shardPositions(uint32_t shard, uint32_t shards) const;
  /// This rank's order (sample ids by position): of one rank every sample (the first used() are
  /// trained), of several exactly its used() samples, taken from the epoch's order `all`.
  std::vector<uint32_t> order(uint64_t seed, uint64_t epoch) const;
  std::vector<uint32_t> share(std::span<const uint32_t> all) const;
  /// Throws DatasetError naming the figures when a rank would get no batch.
  void check() const;

 private:
  uint64_t rounds() const;  // full rounds of `ranks` whole batches
  uint64_t rest() const;    // positions after them split among the ranks (0: none)
};

/// Mixes values into one well-spread 64-bit seed (splitmix64 finaliser); used to derive the
/// epoch permutation seed and, by augmenters, a per-batch seed from (seed, epoch, position).
uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

/// The seed of the random draws of the sample at `position` of a pass whose base seed is `base`
/// (troupe.data.DataLoader's per-sample seeds: torch's, random's and numpy's generators in its
/// workers, and the C++ transforms of an ImageDataset on the data group, draw from it).
inline uint64_t sampleSeed(uint64_t base, uint64_t position) {
  return mixSeed(base, position, 0x5eed5a3b1e);
}

/// A run of consecutive positions handed out by an EpochCursor.
struct CursorBatch {
  uint64_t epoch = 0;
  uint64_t begin = 0;             ///< Position of the first sample in the epoch order.
  std::vector<uint32_t> samples;  ///< Sample ids, in order.

  /// Position just after the last sample: what the consumer acknowledges.
  uint64_t end() const { return begin + samples.size(); }
};

/// What must survive a producer restart: the epoch and how much of it the consumer has
/// acknowledged. Together with the shard and the seed it determines everything else.
struct CursorState {
  uint64_t epoch = 0;
  uint64_t acknowledged = 0;
};

/// Walks one shard epoch by epoch. Not thread-safe: one producer owns it.
class EpochCursor {
 public:
  /// Starts at `state` (default: the beginning of epoch 0). Throws DatasetError if
  /// state.acknowledged exceeds the shard size.
  EpochCursor(std::vector<uint32_t> shard, uint64_t seed, CursorState state = {});

  /// Hands out up to `maxSamples` samples after the last handed-out one; an empty batch when the
  /// epoch is exhausted. Throws DatasetError if maxSamples is 0.
  CursorBatch next(size_t maxSamples);

  /// Records that the consumer has consumed every sample before `position` of `epoch`. Repeated
  /// or older acknowledgements (a retry, a late message from before a restart) are ignored.
  /// Throws DatasetError for a position that was never handed out or for another epoch than
  /// the current one, because that means the two sides disagree about the stream.
  void acknowledge(uint64_t epoch, uint64_t position);

  /// Forgets what was handed out but not acknowledged, so `next` sends it again; for a consumer
  /// that reconnects and lost batches in flight.
  void rewindToAcknowledged() { handedOut_ = acknowledged_; }

  /// Moves to the next epoch. Throws DatasetError unless the whole epoch was acknowledged;
  /// skipping unacknowledged samples would break exactly-once delivery.
  void startNextEpoch();

  /// The state to persist or to give a replacement producer.
  CursorState state() const { return {epoch_, acknowledged_}; }

  uint64_t epoch() const { return epoch_; }
  /// Positions handed out so far in this epoch.
  uint64_t handedOut() const { return handedOut_; }
  /// Positions acknowledged so far in this epoch.
  uint64_t acknowledged() const { return acknowledged_; }
  /// Samples per epoch (the shard size).
  uint64_t epochSize() const { return order_.size(); }
  /// Every sample of the epoch has been handed out.
  bool exhausted() const { return handedOut_ == order_.size(); }
  /// Every sample of the epoch has been acknowledged.
  bool complete() const { return acknowledged_ == order_.size(); }
  /// This epoch's order (sample ids by position).
  std::span<const uint32_t> order() const { return order_; }

 private:
  std::vector<uint32_t> shard_;
  uint64_t seed_;
  uint64_t epoch_;
  std::vector<uint32_t> order_;
  uint64_t handedOut_;
  uint64_t acknowledged_;
};

}  // namespace troupe::data
