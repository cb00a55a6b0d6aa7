// File: troupe/troupe.h
//
// Everything an actor app includes. See docs/guide.md for a first app.

#pragma once

#include "troupe/actor.h"            // ActorBase, ActorContext, Ref, SpawnOptions, Exit
#include "troupe/app_settings.h"     // an app's flags and hyperparameters, configError()
#include "troupe/co.h"               // Co<T>: coroutines over kj::Promise
#include "troupe/driver.h"           // Driver: spawn, call, stop, monitor from the head
#include "troupe/exit_codes.h"       // how processes exit
#include "troupe/loop.h"             // EventLoop, offload
#include "troupe/received.h"         // Received: a message's bytes kept without a copy
#include "troupe/registry.h"         // Registry: the actor types a binary can host
#include "troupe/run.h"              // troupe::run()
#include "troupe/sagemaker.h"        // SageMakerEnv: hyperparameters, channels, model dir
#include "troupe/sched/placement.h"  // Placement: where actors go
#include "troupe/type_name.h"        // actorTypeName<hello::Greeter>(): "hello.Greeter"
