// A hetero_train-shaped job whose augmenters push malformed batches in front of good ones: the
// trainer must reject each (wrong ids, wrong shape, an unknown shard, too many samples, a stale
// session), say why, and still train on every sample exactly once. The scripted augmenter serves
// the shard's epoch order with blank images (no augmentation), so the only thing under test is the
// trainer's checking of what arrives.
//
// With --tensors the batches are a training script's (troupe.data's DataLoader: TrainerArgs.python)
// and the malformed ones are tensors whose dtype or shape lies about their bytes. The script's side
// is a thread of the head's process here, taking each batch from the trainer (script_learner.h) as
// the Python package does, and checking every tensor and value itself.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fault.capnp.h"
#include "troupe/train/script_learner.h"
#include "train.capnp.h"
#include "troupe/train/actors.h"
#include "troupe/dataset/epoch.h"
#include "troupe/troupe.h"

namespace {

constexpr size_t kPixels = 784;

struct TensorSpec {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset, bytes;
};

struct BatchSpec {
  uint64_t session;
  uint32_t epoch, shard;
  uint64_t begin;
  std::vector<uint32_t> ids;
  size_t floats;  // image floats; n * 784 when well formed
  std::vector<TensorSpec> tensors;  // a script's batch: the image rows, then the targets
};

// A script's batch of `n` samples as the tensors say it is: n x 784 float32, then n int64.
std::vector<TensorSpec> scriptTensors(size_t n) {
  int64_t rows = int64_t(n);
  return {{"<f4", {rows, int64_t(kPixels)}, 0, n * kPixels * 4},
          {"<i8", {rows}, n * kPixels * 4, n * 8}};
}

class ScriptedAugmenter final : public troupe::ActorBase<hetero::Augmenter> {
 public:
  explicit ScriptedAugmenter(troupe::ActorContext& context) : ActorBase(context) {
    auto args = context.args<fault::ScriptedAugmenterArgs>();
    seed_ = args.getSeed();
    batchSize_ = args.getBatchSize();
    samples_ = args.getSamples();
    corrupt_ = args.getCorrupt();
    tensors_ = args.getTensors();
  }

  kj::Promise<void> produce(ProduceContext call) override { return produceCo(call); }

  kj::Promise<void> grant(GrantContext call) override {
    if (call.getParams().getSession() == session_) {
      credits_ += call.getParams().getCredits();
      KJ_IF_MAYBE(w, creditWaiter_) {
        (*w)->fulfill();
        creditWaiter_ = nullptr;
      }
    }
    return kj::READY_NOW;
  }

 private:
  troupe::Co<void> produceCo(ProduceContext call) {
    auto p = call.getParams();
    session_ = p.getSession();
    credits_ = p.getCredits();
    uint32_t epoch = p.getEpoch();
    auto sink = p.getSink();
    // The shard the trainer hands out (one at a time from its queue), as train.Augmenter serves.
    uint32_t index = p.getShard();
    uint32_t shards = p.getShards() > 0 ? p.getShards() : context().instanceCount();
    auto shard = troupe::data::shardIndices(samples_, index, shards);
    auto order = troupe::data::epochOrder(shard, seed_, epoch);
    uint64_t produced = 0;
    for (uint64_t pos = p.getFrom(); pos < order.size(); pos += batchSize_) {
      while (credits_ == 0) co_await creditGranted();
      --credits_;
      auto end = std::min<uint64_t>(pos + batchSize_, order.size());
      std::vector<uint32_t> ids(order.begin() + pos, order.begin() + end);
      if (corrupt_ && epoch == 0 && pos == batchSize_) {
        auto bad =
            tensors_ ? lying(index, epoch, pos, ids) : malformed(index, epoch, pos, ids, order);
        for (auto& b : bad) co_await push(sink, b);
      }
      // Made before the co_await, not inside it: see troupe/co.h on g++ 12.
      BatchSpec good{session_, epoch, index, pos, ids, ids.size() * kPixels};
      if (tensors_) good.tensors = scriptTensors(ids.size());
      co_await push(sink, good);
      produced += ids.size();
    }
    call.getResults().setEnd(order.size());
    call.getResults().setSamples(produced);
  }

  std::vector<BatchSpec> malformed(uint32_t shard, uint32_t epoch, uint64_t pos,
                                   const std::vector<uint32_t>& ids,
                                   const std::vector<uint32_t>& order) {
    size_t n = ids.size();
    auto reversed = ids;
    std::reverse(reversed.begin(), reversed.end());
    std::vector<uint32_t> tooMany(order.begin() + pos, order.begin() + pos + n + 1);
    return {
        {session_, epoch, shard, pos, reversed, n * kPixels},       // not the epoch's order
        {session_, epoch, shard, pos, ids, n * kPixels - 1},        // one float short
        {session_, epoch, 99, pos, ids, n * kPixels},               // no such shard
        {session_, epoch, shard, pos, tooMany, (n + 1) * kPixels},  // over the batch size
        {session_ + 1000, epoch, shard, pos, ids, n * kPixels},     // another session's
    };
  }

  // A script's batches whose tensors lie about their bytes, each the right batch otherwise.
  std::vector<BatchSpec> lying(uint32_t shard, uint32_t epoch, uint64_t pos,
                               const std::vector<uint32_t>& ids) {
    size_t n = ids.size();
    std::vector<BatchSpec> out(4,
                               {session_, epoch, shard, pos, ids, n * kPixels, scriptTensors(n)});
    out[0].tensors[0].dtype = "|O";                              // objects: pointers, not numbers
    out[1].tensors[0].shape[0] += 1000;                          // 1000 rows more than its bytes
    out[2].tensors[1].offset += 8;                               // past the batch's bytes
    out[3].tensors[0].shape = {-int64_t(n), -int64_t(kPixels)};  // a product that fits, negated
    return out;
  }

  troupe::Co<void> push(hetero::BatchSink::Client& sink, const BatchSpec& spec) {
    auto req = sink.pushRequest();
    auto b = req.initBatch();
    b.setSession(spec.session);
    b.setEpoch(spec.epoch);
    b.setShard(spec.shard);
    b.setBegin(spec.begin);
    auto list = b.initSampleIds(spec.ids.size());
    for (size_t i = 0; i < spec.ids.size(); ++i) list.set(i, spec.ids[i]);
    if (!tensors_) {
      b.initLabels(spec.ids.size());  // all zero
      b.initImages(spec.floats * sizeof(float));
      co_await req.send();
      co_return;
    }
    // Each sample's row holds its id, and its target is its id: the script checks both.
    size_t n = spec.ids.size();
    auto bytes = b.initPixels(n * kPixels * 4 + n * 8);
    for (size_t i = 0; i < n; ++i) {
      float value = float(spec.ids[i]);
      auto* row = bytes.begin() + i * kPixels * 4;
      for (size_t k = 0; k < kPixels; ++k) std::memcpy(row + k * 4, &value, 4);
      int64_t target = spec.ids[i];
      std::memcpy(bytes.begin() + n * kPixels * 4 + i * 8, &target, 8);
    }
    auto tensors = b.initTensors(spec.tensors.size());
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      auto& t = spec.tensors[i];
      tensors[i].setDtype(t.dtype);
      auto shape = tensors[i].initShape(t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) shape.set(d, t.shape[d]);
      tensors[i].setOffset(t.offset);
      tensors[i].setBytes(t.bytes);
    }
    co_await req.send();
  }

  kj::Promise<void> creditGranted() {
    auto paf = kj::newPromiseAndFulfiller<void>();
    creditWaiter_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  uint64_t seed_, samples_;
  uint32_t batchSize_;
  bool corrupt_, tensors_;
  uint64_t session_ = 0;
  uint32_t credits_ = 0;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> creditWaiter_;
};

constexpr uint32_t kBatch = 64, kEpochs = 2;
constexpr uint64_t kSamples = 4096, kSeed = 7;
bool tensors = false;  // --tensors

// What a batch handed to the script holds that it should not, or "": two tensors, n x 784
// float32 rows each holding its sample's id, then n int64 targets, the ids; within the bytes.
std::string notAsMade(const troupe::train::StepBatch& b) {
  size_t n = b.ids.size();
  auto bytes = b.images.bytes();
  if (b.tensors.size() != 2) return std::to_string(b.tensors.size()) + " tensors";
  auto& rows = b.tensors[0];
  auto& targets = b.tensors[1];
  if (rows.dtype != "<f4" || rows.shape != std::vector<int64_t>{int64_t(n), int64_t(kPixels)} ||
      rows.offset != 0 || rows.bytes != n * kPixels * 4 || targets.dtype != "<i8" ||
      targets.shape != std::vector<int64_t>{int64_t(n)} || targets.offset != rows.bytes ||
      targets.bytes != n * 8 || bytes.size() < rows.bytes + targets.bytes) {
    return "tensors of dtypes " + rows.dtype + ", " + targets.dtype + " over " +
           std::to_string(bytes.size()) + " bytes";
  }
  for (size_t i = 0; i < n; ++i) {
    float first, last;
    int64_t target;
    std::memcpy(&first, bytes.begin() + i * kPixels * 4, 4);
    std::memcpy(&last, bytes.begin() + (i + 1) * kPixels * 4 - 4, 4);
    std::memcpy(&target, bytes.begin() + targets.offset + i * 8, 8);
    if (first != float(b.ids[i]) || last != float(b.ids[i]) || target != b.ids[i]) {
      return "sample " + std::to_string(b.ids[i]) + "'s values";
    }
  }
  return "";
}

// The training script's side: takes what the trainer hands over until the training ends, and
// counts each epoch's samples itself.
void script(std::shared_ptr<troupe::train::ScriptLearner> learner) {
  using Item = troupe::train::ScriptLearner::Item;
  learner->begin();
  std::vector<uint32_t> seen(kSamples);
  uint64_t samples = 0, wrong = 0;
  for (;;) {
    auto item = learner->next();
    if (item.kind == Item::kBatch) {
      auto why = notAsMade(item.batch);
      if (!why.empty() && wrong++ == 0) printf("SCRIPT: a batch not as made: %s\n", why.c_str());
      for (auto id : item.batch.ids) {
        if (id < kSamples) ++seen[id];
      }
      samples += item.batch.ids.size();
    } else if (item.kind == Item::kEpochEnd) {
      auto once = std::count(seen.begin(), seen.end(), 1u);
      printf("SCRIPT epoch %u: samples %lu, each once %ld, batches not as made %lu\n",
             item.epoch + 1, (unsigned long)samples, long(once), (unsigned long)wrong);
      std::fill(seen.begin(), seen.end(), 0);
      samples = wrong = 0;
    } else {
      printf("SCRIPT ended: %s\n", item.kind == Item::kFinished ? "finished" : item.text.c_str());
      break;
    }
    fflush(stdout);
  }
  fflush(stdout);
}

troupe::Co<void> drive(troupe::Driver& job) {
  // The script runs in the head's process: its trainer there, as troupe.data's rank 0's.
  std::shared_ptr<troupe::train::ScriptLearner> learner;
  std::thread scriptThread;
  if (tensors) {
    learner = troupe::train::ScriptLearner::create();
    scriptThread = std::thread(script, learner);
  }
  struct Joined {
    std::thread& t;
    ~Joined() {
      if (t.joinable()) t.detach();  // the job failed: the process ends with it
    }
  } joined{scriptThread};
  auto place =
      tensors ? troupe::Placement::any().labels(std::string("host=") + job.node().host().cStr())
              : troupe::Placement::group("dnn_group");
  auto trainer = job.spawn<hetero::Trainer>(
      "train.Trainer", place, troupe::SpawnOptions().args<hetero::TrainerArgs>([&](auto a) {
        a.setBatchSize(kBatch);
        a.setSeed(kSeed);
        a.setDataDir(troupe::data::kDefaultFashionMnistDir);
        a.setDevice("cpu");
        if (tensors) {
          a.setScript(learner->id());
          a.setPython(true);
        }
      }));
  auto augmenters = job.spawnMany<hetero::Augmenter>(
      "test.ScriptedAugmenter", troupe::Placement::prefer("data_group").perNode(1),
      troupe::SpawnOptions().args<fault::ScriptedAugmenterArgs>([](auto a) {
        a.setSeed(kSeed);
        a.setBatchSize(kBatch);
        a.setSamples(kSamples);
        a.setCorrupt(true);
        a.setTensors(tensors);
      }));
  auto req = trainer.trainRequest();
  req.setEpochs(kEpochs);
  req.setTrainSamples(kSamples);
  auto sources = req.initSources(augmenters.size());
  for (size_t i = 0; i < augmenters.size(); ++i) augmenters[i].address().toProto(sources[i]);
  auto reply = co_await req.send();
  for (auto e : reply.getEpochs()) {
    printf("RESULT epoch %u: samples %lu, duplicates %lu, missing %lu, rejected %lu\n",
           e.getEpoch() + 1, (unsigned long)e.getSamples(), (unsigned long)e.getDuplicates(),
           (unsigned long)e.getMissing(), (unsigned long)e.getRejected());
  }
  fflush(stdout);
  if (scriptThread.joinable()) scriptThread.join();  // the trainer told it training finished
}

}  // namespace

int main(int argc, char* argv[]) {
  // --tensors (the app's own, before troupe's arguments are read): a script's batches.
  std::vector<char*> args(argv, argv + argc);
  auto flag = std::find_if(args.begin(), args.end(),
                           [](char* a) { return std::strcmp(a, "--tensors") == 0; });
  if (flag != args.end()) {
    tensors = true;
    args.erase(flag);
  }
  argc = int(args.size());
  args.push_back(nullptr);
  argv = args.data();
  troupe::Registry types;
  troupe::train::addTrainer(types);  // "train.Trainer"
  types.add<ScriptedAugmenter>("test.ScriptedAugmenter");
  return troupe::run(argc, argv, types, [](troupe::Driver& job) { return drive(job).promise(); });
}
