// Local ranks: DDP ranks of one instance beyond its troupe process (troupe_procs_per_host > 1,
// docs/pytorch.md "DDP"). The instance's troupe process (local rank 0) starts the script again
// once per other local rank, as torchrun starts its processes; each of those processes gets its
// batches from a trainer in the troupe process, through that trainer's ScriptLearner, over a
// socket pair: the troupe process serves the learner on a thread of its own (serveLocalRank), the
// script's process calls it (LocalRankFeed), one request and its answer at a time.
//
// The protocol (native byte order: both ends are one machine), a request `u8 op` and its
// arguments, then its answer:
//   'R' rank                    -> u32 rank, ranks, localRank, localRanks; str masterAddr; u16 port
//   'N' next                    -> an item: u8 kind, u32 epoch, str text; a batch adds u8 waited,
//                                  u32 n, n x u32 id, str structure, u32 t, t x tensor (str dtype,
//                                  u32 d, d x i64 shape, u64 offset, u64 bytes), str bytes
//   'P' peek                    -> u8 kind, u8 stopping
//   'S' state                   -> u8 0, str bytes | u8 1, str why
//   'L' str bytes, str name     -> u8 0, u32 epoch | u8 1 (RuntimeError) or 2 (StateError), str why
//   'B' begin, 'A' u32 epoch (abandon), 'H' f64 seconds (handed over), 'E' str failure (end)
//                               -> u8 0
// (str: u64 length and the bytes). The script's process ends its script with 'E'; a socket that
// closes before it (the process died) ends the learner with a failure naming the local rank.

#pragma once

#include <functional>
#include <memory>
#include <string>

#include "script_learner.h"

namespace troupe::python {

// What the Python functions of the module call: the process's own learner (the troupe process),
// or the troupe process's, over the socket (a local rank's process).
class Feed {
 public:
  virtual ~Feed() = default;
  virtual train::ScriptLearner::Item next() = 0;
  virtual train::ScriptLearner::Peeked peek() = 0;
  virtual std::string state() = 0;
  virtual uint32_t resumeFrom(const std::string& bytes, const std::string& name) = 0;
  virtual void begin() = 0;
  virtual void end(std::string failure) = 0;
  virtual void abandon(uint32_t epoch) = 0;
  virtual void handedOver(double seconds) = 0;
  // The handoffs this process's script made so far (handedOver()'s tally).
  virtual train::Handoffs handoffs() = 0;
  virtual train::ScriptLearner::Rank rank() = 0;
  // After end(): the troupe process waits for the job's end, which ends it; a local rank's
  // process for the troupe process's (its socket closing), then exits (1 if its script failed).
  [[noreturn]] virtual void waitForJobEnd() = 0;
};

// The troupe process's own learner.
std::unique_ptr<Feed> learnerFeed(std::shared_ptr<train::ScriptLearner> learner);

// The troupe process: serves `learner` to local rank `localRank`'s process (pid `pid`) at the
// other end of `fd` until that process ends. `toTensors` turns a batch without tensors (troupe's
// own pipeline's images and targets) into tensors first.
void serveLocalRank(std::shared_ptr<train::ScriptLearner> learner, int fd, int pid,
                    uint32_t localRank, std::function<void(train::StepBatch&)> toTensors);

// A local rank's process: the learner served at the other end of `fd`.
std::unique_ptr<Feed> localRankFeed(int fd);

}  // namespace troupe::python
