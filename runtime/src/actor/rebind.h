// References to restartable actors. A capability names one incarnation; after a restart the actor
// lives elsewhere, so a reference to an actor with a restart policy is a local forwarding
// capability that re-resolves the actor through the head when a call fails with DISCONNECTED.
// The call that failed still fails (calls in flight fail with a typed error); later calls reach the
// new incarnation.

#pragma once

#include "troupe.capnp.h"
#include "troupe/actor.h"

namespace troupe {

class ActorHost;

proto::Actor::Client rebinding(ActorHost& node, ActorAddress address, proto::Actor::Client direct);
// `direct` is the capability of `address`'s incarnation. Returns `direct` itself when the actor
// has no restart policy (address.restartable is false).

}  // namespace troupe
