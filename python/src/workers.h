// The worker processes of a troupe.data.DataLoader on this instance (python/troupe/data.py forks
// them before the runtime starts, as torch's DataLoader forks its workers): each computes
// dataset[i] for a batch of sample ids and collate_fn's batch of them, writes the tensors' bytes
// into its shared memory and answers with their dtypes, shapes and offsets. ProcessWorkers is
// the process's BatchMaker (actors/train/batch_maker.h): augmenters ask it for batches on the
// node's pool; a free worker takes each. A worker that dies loses only its batch, which the next
// free worker makes; when none is left the batch fails, naming why.
//
// The protocol (little-endian), per worker: a request pipe, `u32 epoch, u32 n, n x u32 id`; a
// reply pipe, `u32 length` and that many bytes of JSON: {"error": "..."} or {"structure": ...,
// "tensors": [{"dtype": "<f4", "shape": [...], "offset": 0, "bytes": N}, ...]}; the tensors'
// bytes at those offsets of its memfd.

#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "batch_maker.h"

namespace troupe::python {

struct WorkerFds {
  int pid = 0;
  int request = -1;  // this process writes
  int reply = -1;    // this process reads
  int memory = -1;   // the worker's shared memory (a memfd)
  size_t size = 0;
};

class ProcessWorkers final : public troupe::train::BatchMaker {
 public:
  explicit ProcessWorkers(const std::vector<WorkerFds>& workers);
  ~ProcessWorkers() override;
  troupe::train::MadeBatch make(uint32_t epoch, std::span<const uint32_t> ids) override;
  size_t alive() const;

 private:
  struct Worker {
    WorkerFds fds;
    const uint8_t* memory = nullptr;
    bool busy = false, dead = false;
  };
  // One try on worker `w`: the batch, or why the worker is gone (then `dead`).
  bool tryMake(Worker& w, uint32_t epoch, std::span<const uint32_t> ids,
               troupe::train::MadeBatch& out);
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<Worker> workers_;
};

}  // namespace troupe::python
