// An actor whose interface does not extend Troupe.Actor: the first error must say so.
#include <troupe/troupe.h>

#include "compile_fail.capnp.h"

#ifdef TROUPE_WRITTEN_RIGHT
using Interface = troupe::compile_fail::Counter;
#else
using Interface = troupe::compile_fail::Plain;
#endif

class Counter final : public troupe::ActorBase<Interface> {
 public:
  using ActorBase::ActorBase;
  kj::Promise<void> add(AddContext call) override {
    total_ += call.getParams().getN();
    call.getResults().setTotal(total_);
    return kj::READY_NOW;
  }

 private:
  uint64_t total_ = 0;
};

void registerCounter(troupe::Registry& types) {
  types.add<Counter>();
}
