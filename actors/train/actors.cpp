// The registry entries of actors/train's actors (troupe/train/actors.h).

#include "troupe/train/actors.h"

#include "augmenter_actor.h"
#include "mlp_learner.h"
#include "trainer_actor.h"

namespace troupe::train {

void addActorTypes(Registry& types) {
  modelLearnerFactory = &makeMlpLearner;
  addScriptActorTypes(types);
}

void addTrainer(Registry& types, std::string name) {
  modelLearnerFactory = &makeMlpLearner;
  types.add<TrainerActor>(kj::mv(name));
}

}  // namespace troupe::train
