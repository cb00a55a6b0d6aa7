// File: batch_maker.h
//
// Batches made outside the augmenter's own C++ pipeline: a training script's Dataset, whose
// __getitem__ and collate_fn run in worker processes of the script (the Python package's
// troupe.data.DataLoader, python/src/workers.cpp). The process registers one maker; augmenters
// started with AugmenterArgs.python ask it for each batch of sample ids, on the node's pool,
// and stream what it returns as named tensors (train.capnp, Batch.tensors).

#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/send_buffer.h"

namespace troupe::train {

struct MadeTensor {
  std::string dtype;  // numpy's typestr: "<f4", "|u1", "<i8", ...
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;  // in MadeBatch::data
};

struct MadeBatch {
  std::vector<MadeTensor> tensors;
  std::string structure;  // how the tensors nest (tuple, list, dict): the maker's own encoding
  SendBuffer data;        // every tensor's bytes
  std::string failure;    // nonempty: the batch could not be made (a sample's exception)
  // Samples whose __getitem__ raised, left out of the batch (skip_errors): ids and why.
  std::vector<uint32_t> skipped;
  std::vector<std::string> skippedWhy;
};

class BatchMaker {
 public:
  virtual ~BatchMaker() = default;
  // The samples `ids` of `epoch`, collated; blocks (call it on the pool). Throws when no worker
  // is left to make it.
  virtual MadeBatch make(uint32_t epoch, std::span<const uint32_t> ids) = 0;
};

void setBatchMaker(std::shared_ptr<BatchMaker> maker);
std::shared_ptr<BatchMaker> batchMaker();  // null: none registered in this process

}  // namespace troupe::train
