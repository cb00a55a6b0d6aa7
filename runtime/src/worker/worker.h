// A worker node's side of the cluster (worker.cpp): its join, heartbeats and exit.

#pragma once

#include <kj/memory.h>

namespace troupe {

class NodeRuntime;

class Worker {
 public:
  explicit Worker(NodeRuntime& node);
  ~Worker() noexcept(false);
  KJ_DISALLOW_COPY(Worker);

  void start();
  // Joins the head and, once in, heartbeats until the job ends; SIGTERM/SIGINT start the
  // cascade. The node exits through NodeRuntime::requestExit with the reason.
  void stopControl();
  // Ends the control path (its thread and connection) before the node goes.
  void logControlPath();
  // The heartbeats' round trips on the control path (bench_cluster reads this line).

 private:
  class Impl;
  kj::Own<Impl> impl_;
};

}  // namespace troupe
