#include "troupe/dataset/epoch.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>

using Catch::Matchers::Contains;
using troupe::data::BatchedEpoch;
using troupe::data::CursorState;
using troupe::data::DatasetError;
using troupe::data::EpochCursor;
using troupe::data::epochOrder;
using troupe::data::shardIndices;

TEST_CASE("shards are balanced and cover every sample exactly once", "[epoch]") {
  for (uint32_t count : {1u, 2u, 3u, 7u, 64u}) {
    std::vector<int> seen(1000);
    size_t smallest = SIZE_MAX, largest = 0;
    for (uint32_t i = 0; i < count; ++i) {
      auto shard = shardIndices(1000, i, count);
      smallest = std::min(smallest, shard.size());
      largest = std::max(largest, shard.size());
      for (uint32_t id : shard) ++seen[id];
    }
    CHECK(largest - smallest <= 1);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

TEST_CASE("bad shard arguments are explained", "[epoch]") {
  CHECK_THROWS_WITH(shardIndices(5, 0, 6), Contains("shard count 6 exceeds the 5 samples"));
  CHECK_THROWS_WITH(shardIndices(5, 3, 3), Contains("shard index 3 is out of range for 3"));
  CHECK_THROWS_WITH(shardIndices(5, 0, 0), Contains("shard count is 0"));
  CHECK_NOTHROW(shardIndices(5, 4, 5));
}

TEST_CASE("epoch order is a deterministic permutation that changes per epoch", "[epoch]") {
  auto shard = shardIndices(10000, 1, 3);
  auto a = epochOrder(shard, 42, 0);
  CHECK(a == epochOrder(shard, 42, 0));
  CHECK(a != epochOrder(shard, 42, 1));
  CHECK(a != epochOrder(shard, 43, 0));
  CHECK(a != shard);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == shard);
  // Pinned values: the order must not change across platforms or releases, or a restarted
  // producer on another machine would disagree with the trainer about positions.
  std::vector<uint32_t> small = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(epochOrder(small, 7, 3) == std::vector<uint32_t>{3, 5, 7, 2, 0, 6, 4, 1});
  CHECK(troupe::data::mixSeed(1, 2, 3) == 17976441468516599815ull);
}

namespace {

// The consumer side: records what it trained on and owns the acknowledged position.
struct Consumer {
  std::vector<int> seen;
  CursorState acked;
  void consume(const troupe::data::CursorBatch& b) {
    REQUIRE(b.epoch == acked.epoch);
    REQUIRE(b.begin == acked.acknowledged);  // In order, nothing skipped.
    for (uint32_t id : b.samples) ++seen[id];
    acked.acknowledged = b.end();
  }
};

}  // namespace

TEST_CASE("a producer restarted from the acknowledged position delivers exactly once", "[epoch]") {
  const auto shard = shardIndices(997, 2, 4);
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    Consumer consumer;
    consumer.seen.assign(997, 0);
    auto producer = std::make_unique<EpochCursor>(shard, 11);
    std::vector<troupe::data::CursorBatch> inFlight;
    while (!producer->complete()) {
      const int action = random() % 10;
      if (action < 5 && !producer->exhausted()) {
        inFlight.push_back(producer->next(1 + random() % 40));
      } else if (action < 8 && !inFlight.empty()) {
        consumer.consume(inFlight.front());
        inFlight.erase(inFlight.begin());
        producer->acknowledge(consumer.acked.epoch, consumer.acked.acknowledged);
      } else if (action == 8) {
        // The data node dies: batches in flight are lost, a replacement starts from the
        // consumer's acknowledged position.
        inFlight.clear();
        producer = std::make_unique<EpochCursor>(shard, 11, consumer.acked);
        producer->acknowledge(consumer.acked.epoch, consumer.acked.acknowledged);  // Idempotent.
      } else if (action == 9 && !inFlight.empty()) {
        // The link drops: the same producer resends what was not acknowledged.
        inFlight.clear();
        producer->rewindToAcknowledged();
      }
    }
    for (uint32_t id : shard) REQUIRE(consumer.seen[id] == 1);
    CHECK(std::accumulate(consumer.seen.begin(), consumer.seen.end(), 0) == int(shard.size()));
  }
}

TEST_CASE("cursor walks epochs and rejects inconsistent acknowledgements", "[epoch]") {
  EpochCursor cursor(shardIndices(10, 0, 1), 5);
  auto b = cursor.next(4);
  CHECK(b.begin == 0);
  CHECK(b.end() == 4);
  CHECK(cursor.handedOut() == 4);
  CHECK_THROWS_WITH(cursor.acknowledge(0, 5), Contains("only 4 samples were handed out"));
  CHECK_THROWS_WITH(cursor.acknowledge(1, 1), Contains("epoch 1"));
  cursor.acknowledge(0, 4);
  cursor.acknowledge(0, 2);  // Stale: ignored.
  CHECK(cursor.acknowledged() == 4);
  CHECK_THROWS_WITH(cursor.startNextEpoch(), Contains("4 of 10 samples acknowledged"));
  b = cursor.next(100);
  CHECK(b.samples.size() == 6);
  CHECK(cursor.exhausted());
  CHECK(cursor.next(3).samples.empty());
  cursor.acknowledge(0, 10);
  CHECK(cursor.complete());
  const std::vector<uint32_t> epoch0(cursor.order().begin(), cursor.order().end());
  cursor.startNextEpoch();
  CHECK(cursor.epoch() == 1);
  CHECK(cursor.state().acknowledged == 0);
  CHECK(std::vector<uint32_t>(cursor.order().begin(), cursor.order().end()) != epoch0);
  cursor.acknowledge(0, 10);  // Late message from the finished epoch: ignored.
  CHECK_THROWS_AS(cursor.next(0), DatasetError);
  CHECK_THROWS_WITH(EpochCursor(shardIndices(10, 0, 1), 5, CursorState{0, 11}),
                    Contains("position 11") && Contains("only 10 samples"));
}

TEST_CASE("a batched epoch is cut as torch's DataLoader cuts it: whole batches but the last, "
          "shards of whole batches",
          "[epoch]") {
  for (bool dropLast : {false, true}) {
    for (uint32_t shards : {1u, 3u, 7u}) {
      BatchedEpoch plan{1000, 64, true, dropLast};
      INFO("drop_last " << dropLast << ", " << shards << " shards");
      CHECK(plan.used() == (dropLast ? 960u : 1000u));
      CHECK(plan.batches() == (dropLast ? 15u : 16u));
      auto order = plan.order(42, 3);
      // Every sample once in the order; the same order for the same seed and epoch only.
      auto sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (uint32_t i = 0; i < 1000; ++i) REQUIRE(sorted[i] == i);
      CHECK(plan.order(42, 3) == order);
      CHECK(plan.order(42, 4) != order);
      // Shards are contiguous runs of whole batches covering the used positions once.
      uint64_t next = 0;
      for (uint32_t s = 0; s < shards; ++s) {
        auto [first, last] = plan.shardPositions(s, shards);
        CHECK(first == next);
        CHECK(first % 64 == 0);
        CHECK((last % 64 == 0 || last == plan.used()));
        CHECK(last > first);
        next = last;
      }
      CHECK(next == plan.used());
    }
  }
  BatchedEpoch unshuffled{10, 4, false, false};
  CHECK(unshuffled.order(1, 1) == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // More shards than batches: one would hold none.
  CHECK_THROWS_WITH(unshuffled.shardPositions(0, 4),
                    Catch::Contains("over 3 batches of 4: every shard needs a batch"));
}

TEST_CASE("a batched epoch shared by DDP ranks: the same batches each, disjoint, every sample "
          "once but a rest too small to share",
          "[epoch][ddp]") {
  struct Case {
    uint64_t samples;
    uint32_t batch, ranks;
    bool dropLast;
    uint64_t perRank;  // batches each rank trains
    uint64_t dropped;
  };
  for (auto c : {Case{1000, 64, 2, false, 8, 0}, Case{1000, 64, 3, false, 6, 0},
                 Case{1000, 64, 2, true, 7, 104}, Case{130, 64, 2, false, 2, 0},
                 Case{129, 64, 2, false, 1, 1}, Case{60000, 128, 4, false, 118, 0},
                 Case{10, 4, 3, false, 1, 0}}) {
    INFO(c.samples << " samples, batches of " << c.batch << ", " << c.ranks << " ranks, drop_last "
                   << c.dropLast);
    BatchedEpoch whole{c.samples, c.batch, true, c.dropLast};
    auto all = whole.order(7, 2);
    std::vector<int> seen(c.samples, 0);
    uint64_t used = 0;
    for (uint32_t r = 0; r < c.ranks; ++r) {
      BatchedEpoch plan{c.samples, c.batch, true, c.dropLast, r, c.ranks};
      REQUIRE_NOTHROW(plan.check());
      CHECK(plan.batches() == c.perRank);
      CHECK(plan.dropped() == c.dropped);
      auto order = plan.order(7, 2);
      REQUIRE(order.size() == plan.used());
      CHECK(order == plan.share(all));
      // Its whole batches are the epoch's batches r, r + R, ...: the same samples as one rank's.
      for (uint64_t k = 0; k + 1 < plan.batches(); ++k) {
        auto global = (r + k * c.ranks) * c.batch;
        for (uint32_t i = 0; i < c.batch; ++i) CHECK(order[k * c.batch + i] == all[global + i]);
      }
      // Only the last batch may be short, never empty.
      CHECK(plan.used() > (plan.batches() - 1) * c.batch);
      for (auto id : order) ++seen[id];
      used += plan.used();
    }
    CHECK(used + c.dropped == c.samples);
    CHECK(std::count(seen.begin(), seen.end(), 1) == int64_t(used));
    CHECK(std::count(seen.begin(), seen.end(), 0) == int64_t(c.dropped));
  }
  // A rank with no batch at all is refused, naming the figures.
  BatchedEpoch tiny{3, 4, true, false, 0, 4};
  CHECK_THROWS_WITH(tiny.check(),
                    Catch::Contains("3 samples in batches of 4 leave rank 0 of 4 no batch"));
}
