// A spawn as the head handles it (proto::SpawnSpec in C++ types). Private to the runtime; shared by
// the actor code, the driver and the head. fromProto/toProto live in head.cpp.

#pragma once

#include <kj/array.h>
#include <kj/time.h>

#include <string>

#include "troupe.capnp.h"
#include "troupe/sched/placement.h"

namespace troupe {

using sched::Placement;

struct SpawnRequest {
  std::string typeName;
  std::string name;
  kj::Array<kj::byte> args;
  Placement placement;
  uint64_t parent = 0;  // 0 = the driver
  bool link = true;
  uint32_t maxRestarts = 0;
  kj::Duration restartWindow = 60 * kj::SECONDS;
  kj::Duration stopTimeout = 5 * kj::SECONDS;
  uint32_t maxConcurrency = 1;
  bool failCallOnly = false;
  kj::Maybe<kj::Duration> callDeadline;
  kj::Maybe<kj::Duration> waitForCapacity;
  uint32_t index = 0, count = 1;  // position within a multi-instance spawn
  bool quiet = false;  // SpawnOptions::quiet(): its start logged at debug level (not carried)

  static SpawnRequest fromProto(proto::SpawnSpec::Reader spec);
  void toProto(proto::SpawnSpec::Builder spec) const;
};

}  // namespace troupe
