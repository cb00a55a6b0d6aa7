// File: batch_maker.h
//
// Batches made outside the augmenter's own C++ pipeline: a training script's Dataset, whose
// __getitem__ and collate_fn run in worker processes of the script (the Python package's
// troupe.data.DataLoader, worker_pool.h). The process registers one maker; augmenters
// started with AugmenterArgs.python ask it for each batch of sample ids, from the event loop, and
// stream what it returns as named tensors (train.capnp, Batch.tensors). The maker answers
// asynchronously: an augmenter has as many batches in the making as its stream's credits.

#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <kj/async.h>

#include "troupe/send_buffer.h"

namespace troupe::train {

struct MadeTensor {
  std::string dtype;  // numpy's typestr: "<f4", "|u1", "<i8", ...
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;  // in MadeBatch::data
};

// A numpy typestr's item size ("<f4": 4, "|u1": 1, "|b1": 1), or 0 when it is not a numeric
// dtype a tensor has (bool, int, uint, float, complex, of their sizes): what a tensor's bytes
// are checked against (its shape's product times this), on both ends of the wire. Strings,
// objects and records are refused: the worker says so (_workers.py), the receiver never makes
// an array of them.
inline uint64_t numpyItemSize(const std::string& dtype) {
  if (dtype.size() < 3 || dtype.size() > 4 ||
      std::string("<>|=").find(dtype[0]) == std::string::npos) {
    return 0;
  }
  auto size = dtype.substr(2);
  auto oneOf = [&](std::initializer_list<const char*> sizes) -> uint64_t {
    for (auto s : sizes) {
      if (size == s) return std::stoul(size);
    }
    return 0;
  };
  switch (dtype[1]) {
    case 'b':
      return oneOf({"1"});
    case 'i':
    case 'u':
      return oneOf({"1", "2", "4", "8"});
    case 'f':
      return oneOf({"2", "4", "8"});
    case 'c':
      return oneOf({"8", "16"});
    default:
      return 0;
  }
}

// Whether `bytes` are exactly what a tensor of `dtype` and `shape` holds (no overflow).
inline bool tensorBytesFit(const std::string& dtype, const std::vector<int64_t>& shape,
                           uint64_t bytes) {
  uint64_t size = numpyItemSize(dtype), elements = 1;
  if (size == 0) return false;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && elements > (1ull << 62) / uint64_t(d))) return false;
    elements *= uint64_t(d);
  }
  return elements <= (1ull << 62) / size && elements * size == bytes;
}

struct MadeBatch {
  std::vector<MadeTensor> tensors;
  std::string structure;  // how the tensors nest (tuple, list, dict): the maker's own encoding
  SendBuffer data;        // every tensor's bytes
  std::string failure;    // nonempty: the batch could not be made (a sample's exception)
  std::string traceback;  // of the failure, where the maker has one (a Python traceback)
  // Samples whose __getitem__ raised, left out of the batch (skip_errors): ids and why.
  std::vector<uint32_t> skipped;
  std::vector<std::string> skippedWhy;
};

// How a loader's workers run on a node (AugmenterArgs.workers): the same for every batch of the
// loader; the maker starts the loader's workers with them at its first batch.
struct WorkerSettings {
  uint32_t loader = 0;          // which of the script's DataLoaders (0: the first it made)
  uint32_t workers = 0;         // worker processes on this node; 0: its CPUs (defaultWorkers)
  uint32_t prefetchFactor = 2;  // batches in the making per worker
  uint64_t sharedMemoryBytes = 1ull << 30;  // per worker, one slot per batch in the making
  // The loader's workers' spec, pickled (a loader made after the first), one copy per process.
  std::shared_ptr<const std::string> pickled;
  std::string host;     // this node's (worker seeds differ by instance; messages name it)
  uint32_t vcpus = 1;   // this node's, for the default worker count
};

// One batch to make: sample ids `ids` of pass `pass` (the script's epoch `label`), whose random
// draws derive from `baseSeed` and each one's place in the whole pass, `places`
// (python/troupe/_workers.py).
struct MakeRequest {
  std::shared_ptr<const WorkerSettings> settings;
  uint32_t pass = 0, label = 0;
  uint64_t baseSeed = 0;
  std::vector<uint32_t> ids;
  std::vector<uint64_t> places;
  std::string update;  // the Dataset's attributes the script changed, pickled (PassPlan::update)
};

class BatchMaker {
 public:
  virtual ~BatchMaker() = default;
  // Call on the event loop; resolves there. A batch that cannot be made (a sample's exception)
  // resolves with MadeBatch::failure; rejects when no worker is left to make it.
  virtual kj::Promise<MadeBatch> make(MakeRequest request) = 0;
};

void setBatchMaker(std::shared_ptr<BatchMaker> maker);
std::shared_ptr<BatchMaker> batchMaker();  // null: none registered in this process

}  // namespace troupe::train
