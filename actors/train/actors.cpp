// The registry entries of actors/train's actors (troupe/train/actors.h).

#include "troupe/train/actors.h"

#include "augmenter_actor.h"
#include "trainer_actor.h"

namespace troupe::train {

void addActorTypes(Registry& types) {
  types.add<AugmenterActor>();  // "train.Augmenter" (train.capnp's Augmenter)
  types.add<TrainerActor>();    // "train.Trainer"
}

void addTrainer(Registry& types, std::string name) {
  types.add<TrainerActor>(kj::mv(name));
}

}  // namespace troupe::train
