// The trainer's planned passes (trainer_actor.h, BatchOrder.planned): a training script's
// DataLoader plans each pass (its sampler's batches); the trainer cuts it into shards of whole
// batches, counts its positions once each, and ends it early when the script leaves it.

#include <algorithm>

#include "trainer_actor.h"

namespace troupe::train {

void TrainerActor::usePlan(std::shared_ptr<const PassPlan> plan) {
  plan_ = kj::mv(plan);
  auto& p = *plan_;
  sources_.clear();
  uint32_t per = batchesPerShard();
  for (size_t b = 0; b < p.ends.size(); b += per) {
    Source s{uint32_t(sources_.size())};
    s.first = b ? p.ends[b - 1] : 0;
    size_t last = std::min<size_t>(b + per, p.ends.size());
    s.expected.assign(p.ids.begin() + s.first, p.ids.begin() + p.ends[last - 1]);
    for (size_t k = b; k < last; ++k) s.ends.push_back(uint32_t(p.ends[k] - s.first));
    sources_.push_back(kj::mv(s));
  }
  seen_.assign(p.ids.size(), 0);
  plannedSteps_ = p.ends.size();
}

uint64_t TrainerActor::batchEnd(const Source& s, uint64_t position) const {
  if (!planned_) return std::min<uint64_t>(position + batchSize_, s.expected.size());
  auto it = std::upper_bound(s.ends.begin(), s.ends.end(), position);
  return it == s.ends.end() ? s.expected.size() : *it;
}

size_t TrainerActor::seenIndex(uint32_t source, uint64_t begin, size_t k, uint32_t id) const {
  return planned_ ? size_t(sources_[source].first + begin + k) : size_t(id);
}

void TrainerActor::abandonPass(uint32_t pass) {
  if (!planned_ || pass != epoch_ || !training_ || plan_ == nullptr) return;
  uint64_t left = 0;
  for (uint32_t i = 0; i < sources_.size(); ++i) {
    auto& s = sources_[i];
    unassign(i);  // its stream's batches still to come are stale; queued ones are dropped
    left += s.expected.size() - std::min<uint64_t>(s.acked, s.expected.size());
    s.acked = s.expected.size();
    s.produced = true;
  }
  // Neither trained on nor missing: the script's choice (a break). Not made either.
  stats_.abandoned += left;
  for (size_t i = 0; i < seen_.size(); ++i) seen_[i] = seen_[i] ? seen_[i] : 1;
  wake();
}

}  // namespace troupe::train
