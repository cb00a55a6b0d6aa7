// A training script in the trainer's process as its learner (script_learner.h).

#include "troupe/train/script_learner.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "troupe/log.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

#include "trainer_actor.h"

namespace troupe::train {

namespace {

// The learners of this process by id: the trainer actor, spawned through the runtime with only
// its arguments, finds its script's learner here (TrainerArgs.script).
std::mutex tableMutex;
std::map<uint64_t, std::weak_ptr<ScriptLearner>> table;
uint64_t nextId = 1;

}  // namespace

std::shared_ptr<ScriptLearner> ScriptLearner::create() {
  auto learner = std::make_shared<ScriptLearner>();
  std::lock_guard lock(tableMutex);
  learner->id_ = nextId++;
  table[learner->id_] = learner;
  return learner;
}

std::shared_ptr<ScriptLearner> ScriptLearner::findOrCreate(uint64_t id) {
  std::lock_guard lock(tableMutex);
  auto& slot = table[id];
  if (auto found = slot.lock()) return found;
  auto learner = std::make_shared<ScriptLearner>();
  learner->id_ = id;
  slot = learner;
  nextId = std::max(nextId, id + 1);
  return learner;
}

void ScriptLearner::endEvery(const std::function<bool(uint64_t)>& which,
                             const std::string& failure) {
  std::vector<std::shared_ptr<ScriptLearner>> chosen;
  {
    std::lock_guard lock(tableMutex);
    for (auto& [id, weak] : table) {
      if (!which(id)) continue;
      if (auto learner = weak.lock()) chosen.push_back(learner);
    }
  }
  for (auto& learner : chosen) learner->end(failure);
}

std::shared_ptr<ScriptLearner> ScriptLearner::find(uint64_t id) {
  std::lock_guard lock(tableMutex);
  auto it = table.find(id);
  return it == table.end() ? nullptr : it->second.lock();
}

// -- the script's side --

bool ScriptLearner::awaitItemFor(std::unique_lock<std::mutex>& lock, double timeout) {
  if (holding_) {
    holding_->fulfill(StepResult{});  // the batch it held is trained: the trainer goes on
    holding_ = nullptr;
  }
  auto ready = [this] { return !queue_.empty(); };
  if (timeout <= 0) {
    changed_.wait(lock, ready);
    return true;
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  return changed_.wait_until(lock, until, ready);
}

ScriptLearner::Item ScriptLearner::next(double timeout) {
  std::unique_lock lock(mutex_);
  if (!awaitItemFor(lock, timeout)) {
    Item late;
    late.kind = Item::kFailed;
    late.text = "DataLoader timed out after " + std::to_string(int(timeout)) + " seconds";
    late.timedOut = true;
    return late;
  }
  auto item = kj::mv(queue_.front());
  queue_.pop_front();
  if (item.kind == Item::kBatch) {
    holding_ = kj::mv(queuedSteps_.front());
    queuedSteps_.pop_front();
    item.batch.done->store(true);
  }
  return item;
}

ScriptLearner::Peeked ScriptLearner::peek(double timeout) {
  std::unique_lock lock(mutex_);
  if (!awaitItemFor(lock, timeout)) return Peeked{Item::kFailed, stopping_, true};
  return Peeked{queue_.front().kind, stopping_};
}

std::string ScriptLearner::state() {
  const kj::Executor* executor;
  {
    std::lock_guard lock(mutex_);
    if (!executor_) throw std::runtime_error("the stream has not started: no state yet");
    executor = executor_.get();
  }
  try {
    return executor->executeSync([this]() -> std::string {
      if (trainer_ == nullptr) throw std::runtime_error("the stream's trainer has ended");
      auto state = trainer_->snapshot();
      state.writtenBy = std::string(trainer_->node().host().cStr()) + ", the script's state_dict()";
      return encodeCheckpoint(state);
    });
  } catch (const kj::Exception& e) {
    throw std::runtime_error(std::string("the stream's state cannot be read: ") +
                             e.getDescription().cStr());
  }
}

ScriptLearner::Resumed ScriptLearner::resumeFrom(const std::string& bytes,
                                                 const std::string& name) {
  auto state = decodeCheckpoint(bytes, name);
  if (!state.parameters.empty()) {
    throw CheckpointError(name +
                          " is a hetero_train checkpoint (it holds a model), not a "
                          "troupe.data stream's state_dict()");
  }
  std::lock_guard lock(mutex_);
  if (begun_) {
    throw std::runtime_error(
        "load_state_dict() after the stream started: call it before the first epoch");
  }
  Resumed resumed{state.epoch, state.plan.has_value(), state.plan ? state.plan->label : 0};
  given_ = LoadedCheckpoint{name, kj::mv(state)};
  return resumed;
}

void ScriptLearner::begin() {
  std::lock_guard lock(mutex_);
  if (begun_) return;
  begun_ = true;
  if (begunFulfiller_) begunFulfiller_->fulfill();
}

void ScriptLearner::beginPass(uint32_t pass, PassPlan plan) {
  std::lock_guard lock(mutex_);
  passes_[pass] = {plan.label, plan.ends.size()};
  auto made = std::make_shared<const PassPlan>(std::move(plan));
  if (planWaiter_ && planWanted_ == pass) {
    planWaiter_->fulfill(kj::mv(made));
    planWaiter_ = nullptr;
    return;
  }
  plans_[pass] = kj::mv(made);
}

kj::Promise<std::shared_ptr<const PassPlan>> ScriptLearner::plan(uint32_t pass) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<std::shared_ptr<const PassPlan>>();
  std::lock_guard lock(mutex_);
  auto it = plans_.find(pass);
  if (it != plans_.end()) {
    auto found = it->second;
    plans_.erase(plans_.begin(), std::next(it));  // (older ones were never started: gone)
    return found;
  }
  planWanted_ = pass;
  planWaiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void ScriptLearner::abandon(uint32_t epoch) {
  // What the trainer has not handed over yet is not made (its streams end now).
  const kj::Executor* executor = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (executor_) executor = executor_.get();
  }
  if (executor != nullptr) {
    try {
      executor->executeSync([this, epoch]() {
        if (trainer_ != nullptr) trainer_->abandonPass(epoch);
      });
    } catch (const kj::Exception&) {
      // The trainer's loop is gone: the job is ending.
    }
  }
  std::lock_guard lock(mutex_);
  if (holding_) {
    holding_->fulfill(StepResult{});  // received before the break: trained
    holding_ = nullptr;
  }
  abandoned_ = epoch;
  // What waits in the queue of that epoch goes back unused (an item per batch and its step).
  std::deque<Item> kept;
  for (auto& item : queue_) {
    if (item.kind == Item::kBatch && item.epoch == epoch) {
      StepResult r;
      r.abandoned = true;
      queuedSteps_.front()->fulfill(kj::mv(r));
      queuedSteps_.pop_front();
    } else {
      if (item.kind == Item::kBatch) {
        // (batches of a later epoch keep their step fulfillers in order: rotate it to the back)
        queuedSteps_.push_back(kj::mv(queuedSteps_.front()));
        queuedSteps_.pop_front();
      }
      kept.push_back(kj::mv(item));
    }
  }
  queue_ = kj::mv(kept);
}

void ScriptLearner::end(std::string failure, bool died) {
  std::lock_guard lock(mutex_);
  if (ended_) return;
  ended_ = true;
  failure_ = kj::mv(failure);
  died_ = died;
  if (holding_) {
    holding_->fulfill(StepResult{});
    holding_ = nullptr;
  }
  for (auto& w : endWaiters_) w->fulfill(std::string(failure_));
  endWaiters_.clear();
}

void ScriptLearner::handedOver(double seconds) {
  std::lock_guard lock(mutex_);
  ++handoffs_.count;
  handoffs_.seconds += seconds;
}

Handoffs ScriptLearner::handoffs() const {
  std::lock_guard lock(mutex_);
  return handoffs_;
}

bool ScriptLearner::ended() const {
  std::lock_guard lock(mutex_);
  return ended_;
}

// -- the trainer's side --

void ScriptLearner::attach(TrainerActor& trainer) {
  {
    std::lock_guard lock(mutex_);
    trainer_ = &trainer;
    executor_ = kj::getCurrentThreadExecutor().addRef();
    if (!rank_) {
      auto order = trainer.args_.getOrder();
      auto ddp = trainer.args_.getDdp();
      Rank r;
      r.rank = order.getRank();
      r.ranks = std::max<uint32_t>(order.getRanks(), 1);
      r.localRank = ddp.getLocalRank();
      r.localRanks = std::max<uint32_t>(ddp.getLocalRanks(), 1);
      r.masterAddr = ddp.getMasterAddr().cStr();
      r.masterPort = ddp.getMasterPort();
      r.seed = ddp.getSeed();
      rank_ = r;
    }
  }
  changed_.notify_all();
}

ScriptLearner::Rank ScriptLearner::waitAttached() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return rank_.has_value(); });
  return *rank_;
}

void ScriptLearner::detach() {
  std::lock_guard lock(mutex_);
  trainer_ = nullptr;
}

kj::Promise<void> ScriptLearner::begun() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  std::lock_guard lock(mutex_);
  if (begun_) return kj::READY_NOW;
  begunFulfiller_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<std::string> ScriptLearner::whenEnded() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<std::string>();
  std::lock_guard lock(mutex_);
  if (ended_) return std::string(failure_);
  endWaiters_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void ScriptLearner::push(Item item) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(kj::mv(item));
  }
  changed_.notify_all();
}

kj::Promise<void> ScriptLearner::start(ActorContext& context) {
  spdlog::info("trainer on {}: batches go to the training script in this process",
               context.node().host());
  return kj::READY_NOW;
}

kj::Promise<StepResult> ScriptLearner::step(ActorContext&, StepBatch batch) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<StepResult>();
  {
    std::lock_guard lock(mutex_);
    if (ended_) return kj::NEVER_DONE;  // nobody takes it: the job is ending
    if (abandoned_ && *abandoned_ == batch.epoch) {
      StepResult r;  // the script left this epoch: never handed to it
      r.abandoned = true;
      return r;
    }
    Item item;
    item.kind = Item::kBatch;
    item.epoch = batch.epoch;
    item.batch = kj::mv(batch);
    queue_.push_back(kj::mv(item));
    queuedSteps_.push_back(kj::mv(paf.fulfiller));
  }
  changed_.notify_all();
  return kj::mv(paf.promise);
}

kj::Promise<double> ScriptLearner::evaluate(ActorContext&, uint32_t) {
  return double(NAN);  // the script evaluates on its own (epochEnded() tells it the epoch ended)
}

void ScriptLearner::epochEnded(uint32_t epoch) {
  // After the trainer recorded the epoch: a state() from here on holds the next one. Meanwhile
  // the next epoch's streams fill the trainer's queue.
  Item item;
  item.kind = Item::kEpochEnd;
  item.epoch = epoch;
  if (trainer_ != nullptr && !trainer_->history_.empty()) {
    // The epoch's counts as the trainer kept them, for the script (DataLoader.epoch_reports).
    auto& h = trainer_->history_.back();
    nlohmann::json skipped = nlohmann::json::array();
    for (auto& f : trainer_->skippedFiles_) skipped.push_back(f);
    nlohmann::json warned = nlohmann::json::array();
    for (auto& f : trainer_->warnedFiles_) warned.push_back(f);
    nlohmann::json report{
        {"pass", epoch},          {"samples", h.samples},          {"duplicates", h.duplicates},
        {"missing", h.missing},   {"skipped", h.skipped},          {"skipped_files", skipped},
        {"warned_files", warned}, {"abandoned", h.abandoned},      {"steps", h.steps},
        {"seconds", h.seconds},   {"wait_seconds", h.waitSeconds}, {"rejected", h.rejected}};
    std::lock_guard lock(mutex_);
    if (auto it = passes_.find(epoch); it != passes_.end()) {
      report["epoch"] = it->second.first;  // the script's
      report["batches"] = it->second.second;
      passes_.erase(passes_.begin(), std::next(it));
    } else {
      report["epoch"] = epoch;
    }
    item.text = report.dump();
  }
  push(kj::mv(item));
}

std::optional<LoadedCheckpoint> ScriptLearner::givenState() {
  std::lock_guard lock(mutex_);
  return given_;
}

void ScriptLearner::finished(const std::vector<EpochRecord>& history) {
  auto epochs = nlohmann::json::array();
  for (size_t i = 0; i < history.size(); ++i) {
    auto& h = history[i];
    epochs.push_back({{"epoch", i},
                      {"samples", h.samples},
                      {"duplicates", h.duplicates},
                      {"missing", h.missing},
                      {"rejected", h.rejected},
                      {"steps", h.steps},
                      {"seconds", h.seconds},
                      {"wait_seconds", h.waitSeconds},
                      {"fill_seconds", h.fillSeconds},
                      {"step_seconds", h.stepSeconds},
                      {"from_checkpoint", h.fromCheckpoint},
                      {"digest", h.digest},
                      {"abandoned", h.abandoned}});
  }
  auto h = handoffs();
  Item item;
  item.kind = Item::kFinished;
  item.text = nlohmann::json{{"epochs", epochs},
                             {"handoffs", h.count},
                             {"handoff_us_per_batch", h.count ? 1e6 * h.seconds / h.count : 0.0}}
                  .dump();
  push(kj::mv(item));
}

void ScriptLearner::failed(const kj::Exception& e) {
  Item item;
  item.kind = Item::kFailed;
  item.text = e.getDescription().cStr();
  push(kj::mv(item));
}

kj::Promise<void> ScriptLearner::ended() {
  std::string who;
  {
    std::lock_guard lock(mutex_);
    if (rank_ && rank_->ranks > 1) {
      who = "DDP rank " + std::to_string(rank_->rank) + " of " + std::to_string(rank_->ranks) +
            ": ";
    }
  }
  return whenEnded().then([this, who](std::string failure) -> kj::Promise<void> {
    if (failure.empty()) return kj::READY_NOW;
    auto error = KJ_EXCEPTION(FAILED, kj::str(who, "the training script failed: ", failure));
    bool died;
    {
      std::lock_guard lock(mutex_);
      died = died_;
    }
    if (who.empty() || died || trainer_ == nullptr) return kj::mv(error);
    // A rank's error in a collective is often another rank's death seen first (gloo: "Connection
    // closed by peer"): that rank's own end, if it comes within 3 s, is the job's.
    return trainer_->context().timer().afterDelay(3 * kj::SECONDS).then(
        [error = kj::mv(error)]() mutable -> kj::Promise<void> { return kj::mv(error); });
  });
}

bool ScriptLearner::stepsWhileStopping() const {
  std::lock_guard lock(mutex_);
  return rank_ && rank_->ranks > 1;
}

kj::Promise<void> ScriptLearner::stopping() {
  bool ddp = stepsWhileStopping();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  if (ddp) {
    changed_.notify_all();
  } else {
    Item item;
    item.kind = Item::kStopped;
    push(kj::mv(item));
  }
  return whenEnded().ignoreResult();
}

}  // namespace troupe::train
