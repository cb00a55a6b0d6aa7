// File: actors.h
//
// actors/train's two actor types, for a program's registry (troupe/registry.h): train.Augmenter
// (train.capnp's Augmenter: a shard's batches made and streamed, one per vCPU of each data node)
// and train.Trainer (the epochs, the exactly-once count, the learner's steps). A driver spawns
// them by their interfaces (hetero::Augmenter, hetero::Trainer) with their args; what places and
// grows the augmenters is troupe/train/spawn.h. Their classes are the component's own.

#pragma once

#include <string>

#include "troupe/registry.h"

namespace troupe::train {

// Registers train.Augmenter and train.Trainer: every program that runs a training job (its
// driver may spawn either on any node) registers both.
void addActorTypes(Registry& types);

// The same for a program whose trainer serves training scripts only (the Python module,
// script_job.cpp): hetero_train's C++ model and its BLAS are not linked.
void addScriptActorTypes(Registry& types);

// Registers the trainer alone, under `name`: a program whose augmenters are its own actors (a
// test's) serving the same interface.
void addTrainer(Registry& types, std::string name = "train.Trainer");

}  // namespace troupe::train
