// Local ranks: DDP ranks of one instance beyond its troupe process (troupe_procs_per_host > 1,
// docs/pytorch.md "DDP"). The instance's troupe process (local rank 0) starts the script again
// once per other local rank, as torchrun starts its processes; each of those processes gets the
// batches of each of its streams (its DataLoaders, script_job.h) from that stream's trainer in the
// troupe process, through the trainer's ScriptLearner, over one socket pair: the troupe process
// serves the learners on a thread of its own (serveLocalRank), the script's process calls it
// (LocalRankFeed), one request and its answer at a time.
//
// The protocol (native byte order: both ends are one machine), a request `u8 op`, `u32 stream`
// and its arguments, then its answer:
//   'R' rank                    -> u32 rank, ranks, localRank, localRanks; str masterAddr; u16 port;
//                                  u64 the job's seed
//   'N' f64 timeout (next)      -> an item: u8 kind, u32 epoch, str text, u8 timed out; a batch
//                                  adds u8 waited, u32 n, n x u32 id, str structure, u32 t,
//                                  t x tensor (str dtype, u32 d, d x i64 shape, u64 offset,
//                                  u64 bytes), str bytes
//   'P' peek, f64 timeout       -> u8 kind, u8 stopping, u8 timed out
//   'S' state                   -> u8 0, str bytes | u8 1, str why
//   'L' str bytes, str name     -> u8 0, u32 pass, u8 planned, u32 label | u8 1 (RuntimeError) or
//                                  2 (StateError), str why
//   'G' u32 pass, u32 label, u64 base seed, u32 n, n x u32 id, u32 m, m x u32 end (a pass's plan)
//   'B' begin, 'A' u32 epoch (abandon), 'H' f64 seconds (handed over), 'E' str failure (the
//   script's end: every stream of that local rank)
//                               -> u8 0
// (str: u64 length and the bytes). The script's process ends its script with 'E'; a socket that
// closes before it (the process died) ends its learners with a failure naming the local rank.

#pragma once

#include <functional>
#include <memory>
#include <string>

#include "troupe/train/script_learner.h"

namespace troupe::train {

// What the Python functions of the module call: the process's own learner (the troupe process),
// or the troupe process's, over the socket (a local rank's process).
class Feed {
 public:
  virtual ~Feed() = default;
  virtual train::ScriptLearner::Item next(double timeout) = 0;
  virtual train::ScriptLearner::Peeked peek(double timeout) = 0;
  virtual std::string state() = 0;
  virtual train::ScriptLearner::Resumed resumeFrom(const std::string& bytes,
                                                   const std::string& name) = 0;
  virtual void begin() = 0;
  virtual void beginPass(uint32_t pass, train::PassPlan plan) = 0;
  // The script ended: every stream of this process (this one's feed and the others) hears it.
  virtual void endAll(const std::string& failure) = 0;
  virtual void abandon(uint32_t epoch) = 0;
  virtual void handedOver(double seconds) = 0;
  // The handoffs this process's script made so far on this stream (handedOver()'s tally).
  virtual train::Handoffs handoffs() = 0;
  virtual train::ScriptLearner::Rank rank() = 0;
  // After endAll(): the troupe process waits for the job's end, which ends it; a local rank's
  // process for the troupe process's (its socket closing), then exits (1 if its script failed).
  [[noreturn]] virtual void waitForJobEnd() = 0;
};

// The troupe process's own learner of a stream (its local rank 0).
std::unique_ptr<Feed> learnerFeed(std::shared_ptr<train::ScriptLearner> learner);

// The troupe process: serves local rank `localRank`'s process (pid `pid`), at the other end of
// `fd`, the learners of that local rank of every stream until that process ends. `toTensors(s,
// batch)` turns a batch of stream s without tensors (troupe's own pipeline's images and
// targets) into tensors first.
void serveLocalRank(int fd, int pid, uint32_t localRank,
                    std::function<void(uint32_t, train::StepBatch&)> toTensors);

// A local rank's process: stream `stream`'s learner, served at the other end of `fd` (one
// connection for all its streams).
std::unique_ptr<Feed> localRankFeed(int fd, uint32_t stream);

}  // namespace troupe::train
