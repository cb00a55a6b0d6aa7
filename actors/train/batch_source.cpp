// The kinds of batch (batch_source.h): which one AugmenterArgs and TrainerArgs name, a stream's
// cut, and the part of reading a batch that the kinds which skip samples share.

#include "batch_source.h"

#include <algorithm>

namespace troupe::train {

// Each kind's halves, in its own file.
std::unique_ptr<BatchSource> idxSource(hetero::AugmenterArgs::Reader args);
std::unique_ptr<BatchReader> idxReader(hetero::TrainerArgs::Reader args);
std::unique_ptr<BatchSource> imageSource(hetero::AugmenterArgs::Reader args);
std::unique_ptr<BatchReader> imageReader(hetero::TrainerArgs::Reader args);
std::unique_ptr<BatchSource> scriptSource(hetero::AugmenterArgs::Reader args,
                                          ActorContext& context);
std::unique_ptr<BatchReader> scriptReader(hetero::TrainerArgs::Reader args);

namespace {

// The kinds, the first that serves the settings chosen: a script's Dataset (python), a dataset
// through the image pipeline (dataset / sample), else Fashion-MNIST's IDX files.
struct Kind {
  bool (*serves)(hetero::AugmenterArgs::Reader);
  bool (*reads)(hetero::TrainerArgs::Reader);
  std::unique_ptr<BatchSource> (*source)(hetero::AugmenterArgs::Reader, ActorContext&);
  std::unique_ptr<BatchReader> (*reader)(hetero::TrainerArgs::Reader);
};

const Kind kKinds[] = {
    {[](hetero::AugmenterArgs::Reader a) { return a.getPython(); },
     [](hetero::TrainerArgs::Reader a) { return a.getPython(); }, scriptSource, scriptReader},
    {[](hetero::AugmenterArgs::Reader a) { return a.getDataset().size() > 0; },
     [](hetero::TrainerArgs::Reader a) { return a.hasSample(); },
     [](hetero::AugmenterArgs::Reader a, ActorContext&) { return imageSource(a); }, imageReader},
    {[](hetero::AugmenterArgs::Reader) { return true; },
     [](hetero::TrainerArgs::Reader) { return true; },
     [](hetero::AugmenterArgs::Reader a, ActorContext&) { return idxSource(a); }, idxReader},
};

}  // namespace

std::unique_ptr<BatchSource> sourceFor(hetero::AugmenterArgs::Reader args, ActorContext& context) {
  for (auto& kind : kKinds) {
    if (kind.serves(args)) return kind.source(args, context);
  }
  KJ_UNREACHABLE;
}

std::unique_ptr<BatchReader> readerFor(hetero::TrainerArgs::Reader args) {
  for (auto& kind : kKinds) {
    if (kind.reads(args)) return kind.reader(args);
  }
  KJ_UNREACHABLE;
}

uint64_t Cut::end(uint64_t position, uint32_t batchSize) const {
  if (ends.empty()) return std::min<uint64_t>(position + batchSize, ids.size());
  auto it = std::upper_bound(ends.begin(), ends.end(), position);
  return it == ends.end() ? ids.size() : *it;
}

bool Cut::startsBatch(uint64_t position) const {
  if (ends.empty() || position == 0 || position >= ids.size()) return true;
  return std::binary_search(ends.begin(), ends.end(), uint32_t(position));
}

void readSkipped(hetero::Batch::Reader batch, std::vector<uint32_t>& skipped,
                 std::vector<std::string>& why, std::vector<std::string>& warned) {
  for (auto id : batch.getSkipped()) skipped.push_back(id);
  for (auto f : batch.getSkippedFiles()) why.push_back(f.cStr());
  for (auto f : batch.getWarned()) warned.push_back(f.cStr());
}

}  // namespace troupe::train
