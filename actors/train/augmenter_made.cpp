// The augmenter's batches of a training script's DataLoader (augmenter_actor.h): what a planned
// pass's stream makes (produce()'s ShardPlan, checked), and those batches made by the process's
// batch maker (batch_maker.h: the script's workers), several at a time, pushed in order.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "augmenter_actor.h"
#include "batch_maker.h"
#include "troupe/dataset/epoch.h"

namespace troupe::train {

uint64_t AugmenterActor::Cut::end(uint64_t position, uint32_t batchSize) const {
  if (ends.empty()) return std::min<uint64_t>(position + batchSize, ids.size());
  auto it = std::upper_bound(ends.begin(), ends.end(), position);
  return it == ends.end() ? ids.size() : *it;
}

bool AugmenterActor::Cut::startsBatch(uint64_t position) const {
  if (ends.empty() || position == 0 || position >= ids.size()) return true;
  return std::binary_search(ends.begin(), ends.end(), uint32_t(position));
}

std::shared_ptr<const AugmenterActor::Cut> AugmenterActor::cutOf(hetero::ShardPlan::Reader plan,
                                                                 uint32_t pass) {
  auto cut = std::make_shared<Cut>();
  for (auto id : plan.getIds()) {
    KJ_REQUIRE(id < samples_, "a planned sample id beyond the dataset", id, samples_);
    cut->ids.push_back(id);
  }
  uint32_t last = 0;
  for (auto end : plan.getEnds()) {
    KJ_REQUIRE(end > last && end <= cut->ids.size(), "a plan's batch ends are not ascending",
               end, last, cut->ids.size());
    cut->ends.push_back(end);
    last = end;
  }
  KJ_REQUIRE(last == cut->ids.size(), "a plan's last batch does not end the shard", last,
             cut->ids.size());
  cut->planned = true;
  cut->pass = pass;
  cut->first = plan.getFirst();
  cut->baseSeed = plan.getBaseSeed();
  cut->label = plan.getLabel();
  return cut;
}

kj::Promise<void> AugmenterActor::pumpMade(uint32_t shard, uint64_t session, uint32_t epoch,
                                           std::shared_ptr<const Cut> cut, uint64_t position,
                                           kj::ForkedPromise<void> sent,
                                           hetero::BatchSink::Client sink) {
  // Up to the stream's credits of batches in the making at once (the node's workers make them in
  // parallel), pushed in the shard's order: each batch's push waits for the one before it.
  if (position >= cut->ids.size()) return sent.addBranch();
  return creditAvailable(current(shard, session))
      .then([this, shard, session, epoch, cut, position, sent = kj::mv(sent),
             sink]() mutable -> kj::Promise<void> {
        --current(shard, session).credits;
        auto end = cut->end(position, batchSize_);
        auto maker = batchMaker();
        KJ_REQUIRE(maker != nullptr,
                   "no batch maker in this process: a script's augmenter runs in the script's own "
                   "process (troupe.data.DataLoader)");
        MakeRequest request;
        request.settings = workers_;
        request.pass = epoch;
        request.label = cut->planned ? cut->label : epoch;
        request.baseSeed = cut->planned ? cut->baseSeed : data::mixSeed(seed_, epoch);
        request.first = cut->first + position;
        request.ids.assign(cut->ids.begin() + position, cut->ids.begin() + end);
        auto asked = std::chrono::steady_clock::now();
        auto made = maker->make(kj::mv(request));
        auto pushed =
            sent.addBranch()
                .then([made = kj::mv(made)]() mutable { return kj::mv(made); })
                .then([this, shard, session, epoch, cut, position, end, asked,
                       sink](MadeBatch batch) mutable {
                  // The worker's time is its own process's; what the advisor counts per batch
                  // here is the wait for it.
                  double waited =
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - asked)
                          .count();
                  return sendMade(shard, session, epoch, *cut, position, end, kj::mv(batch),
                                  waited, sink);
                })
                .fork();
        // A push that fails (the batch could not be made, the stream ended) ends the stream now,
        // not after the batches still waiting for credit.
        auto failed = pushed.addBranch().then([]() -> kj::Promise<void> { return kj::NEVER_DONE; });
        return pumpMade(shard, session, epoch, cut, end, kj::mv(pushed), sink)
            .exclusiveJoin(kj::mv(failed));
      });
}

kj::Promise<void> AugmenterActor::sendMade(uint32_t shard, uint64_t session, uint32_t epoch,
                                           const Cut& cut, uint64_t position, uint64_t end,
                                           MadeBatch made, double waited,
                                           hetero::BatchSink::Client sink) {
  auto request = sink.pushRequest();
  auto b = request.initBatch();
  heading(b, session, epoch, shard, position);
  if (!made.failure.empty()) {
    // Its first line says what and where; the worker's traceback follows (the script's
    // exception shows it once; log lines show the first line).
    auto why = made.traceback.empty()
                   ? made.failure
                   : made.failure + "\nin the DataLoader worker:\n" + made.traceback;
    return fail(kj::mv(request), why);
  }
  size_t n = end - position;
  auto list = b.initSampleIds(n);
  for (size_t i = 0; i < n; ++i) list.set(i, cut.ids[position + i]);
  auto tensors = b.initTensors(made.tensors.size());
  for (size_t i = 0; i < made.tensors.size(); ++i) {
    auto& t = made.tensors[i];
    auto out = tensors[i];
    out.setDtype(t.dtype);
    auto shape = out.initShape(t.shape.size());
    for (size_t k = 0; k < t.shape.size(); ++k) shape.set(k, t.shape[k]);
    out.setOffset(t.offset);
    out.setBytes(t.bytes);
  }
  b.setStructure(made.structure);
  if (!made.skipped.empty()) skipped(b, made.skipped, made.skippedWhy);
  b.adoptPixels(made.data.lend(b));
  auto bytes = made.data.size();
  return sendBatch(kj::mv(request), kj::mv(made.data), shard, session, n, n, bytes, waited, 0);
}

}  // namespace troupe::train
