// The process's batch maker, registered once (batch_maker.h).

#include "troupe/train/batch_maker.h"

#include <mutex>

namespace troupe::train {

namespace {
std::mutex mutex;
std::shared_ptr<BatchMaker> registered;
}  // namespace

void setBatchMaker(std::shared_ptr<BatchMaker> maker) {
  std::lock_guard lock(mutex);
  registered = std::move(maker);
}

std::shared_ptr<BatchMaker> batchMaker() {
  std::lock_guard lock(mutex);
  return registered;
}

}  // namespace troupe::train
