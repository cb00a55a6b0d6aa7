// File: worker_pool.h
//
// The worker processes of a troupe.data.DataLoader on this instance, and the process's batch
// maker (batch_maker.h) that hands them batches.
//
// A loader's workers start at its first batch on this node: the fork server the script forked
// when it made its first loader (python/troupe/_forkserver.py) forks each, so an instance that
// makes no batches runs none. Each worker has a request pipe, a reply pipe and a memfd of
// `sharedMemoryBytes` cut into `prefetchFactor` slots; it takes requests in order and writes each
// batch's tensors into the request's slot. Every worker has up to `prefetchFactor` requests in
// the making at once, as torch's DataLoader keeps prefetch_factor x num_workers batches in
// flight; a request goes to the worker with the fewest. A worker that dies loses only its
// requests, which the others make; a worker takes its place (the fork server forks another).
//
// One thread per pool does all of it with poll(): writes requests (non-blocking), reads replies,
// copies each batch out of its slot into a SendBuffer and resolves its promise on the loop that
// asked (a cross-thread fulfiller). The loop thread only queues.
//
// The protocol (little-endian), per worker:
//   request: u32 pass, u32 label, u64 base seed, u32 slot, u32 n, n x u32 id, n x u64 place
//            (each sample's place in the whole pass, which seeds its draws), u32 u, u bytes: the
//            Dataset's changed attributes, pickled (PassPlan::update)
//   reply:   u32 length, that many bytes of JSON: {"slot": s, "error": "...", "traceback": "..."}
//            or {"slot": s, "structure": ..., "tensors": [{"dtype": "<f4", "shape": [...],
//            "offset": 0, "bytes": N}, ...], "skipped": [[id, why], ...]}, offsets in the slot.

#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/train/batch_maker.h"

namespace troupe::train {

// The fork server at the other end of `fd` (a SOCK_SEQPACKET socket): the process's way to start
// DataLoader workers. Set when the script makes its first loader in a cluster.
void setForkServer(int fd);

// The workers a node runs by default: `vcpus` (its instance's, as the node reports them) on a
// real cluster; under troupe sim its CPU share (TROUPE_CPUS' CPUs with --pin or --cpus, else
// TROUPE_CPU_SCALE x vcpus, rounded up); at least one.
uint32_t defaultWorkers(uint32_t vcpus);

class WorkerPool {
 public:
  // Starts the pool's thread, which starts the workers (WorkerSettings::workers, or
  // defaultWorkers) and says so in one line; when none can start, every batch fails naming why.
  explicit WorkerPool(std::shared_ptr<const train::WorkerSettings> settings);
  ~WorkerPool();

  // Call on a KJ event loop's thread; resolves there.
  kj::Promise<train::MadeBatch> make(train::MakeRequest request);
  uint32_t workers() const { return count_; }

 private:
  struct Job {
    train::MakeRequest request;
    kj::Own<kj::CrossThreadPromiseFulfiller<train::MadeBatch>> done;
    uint32_t killed = 0;  // workers that died making it
  };
  struct Worker {
    uint32_t id = 0;
    int pid = 0, request = -1, reply = -1;
    uint8_t* memory = nullptr;
    std::vector<bool> slotBusy;
    struct Outstanding {
      std::unique_ptr<Job> job;
      uint32_t slot;
    };
    std::deque<Outstanding> outstanding;  // in the order it answers
    std::string out, in;                  // bytes to write, bytes read of replies not yet whole
    size_t written = 0;
    bool dead = false;
  };

  void run();
  void startWorkers();
  Worker start(uint32_t id);  // throws std::runtime_error naming why
  void assign();                   // queued jobs to workers with room
  void writeSome(Worker& w);
  void readSome(Worker& w);
  void answered(Worker& w, const std::string& json);
  void died(Worker& w, const std::string& how);
  void failAll(const std::string& why);

  std::shared_ptr<const train::WorkerSettings> settings_;
  uint32_t count_ = 0;
  uint64_t slotBytes_ = 0;
  uint64_t seedOffset_ = 0;
  std::deque<Worker> workers_;  // the I/O thread's alone once it runs (a deque: no copies)
  uint32_t replaced_ = 0;        // workers started again after a death
  std::string lastStartError_;   // why the last start of a worker failed (the fork server gone)
  std::deque<std::unique_ptr<Job>> queued_;  // the I/O thread's
  std::mutex mutex_;             // guards incoming_ and stop_
  std::deque<std::unique_ptr<Job>> incoming_;
  bool stop_ = false;
  std::string broken_;  // set when no worker is left: later requests fail with it
  int wake_ = -1;       // an eventfd
  std::thread thread_;
};

// The process's batch maker: a WorkerPool per loader, made at the loader's first batch.
class ProcessBatchMaker final : public train::BatchMaker {
 public:
  kj::Promise<train::MadeBatch> make(train::MakeRequest request) override;

 private:
  std::mutex mutex_;
  std::map<uint32_t, std::shared_ptr<WorkerPool>> pools_;
};

}  // namespace troupe::train
