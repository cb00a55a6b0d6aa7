// References to restartable actors. A capability names one incarnation; after a restart the actor
// lives elsewhere, so a reference to an actor with a restart policy is a local forwarding
// capability that re-resolves the actor through the head before its next call when a call through
// it failed (any failure: a method that threw ends the incarnation) or when the head has told this
// node of a newer incarnation (Node.actorRestarted, sent to every node before monitors hear of the
// restart). The call that failed still fails (calls in flight fail with a typed error); the next
// call reaches the new incarnation.

#pragma once

#include "troupe.capnp.h"
#include "troupe/actor.h"

namespace troupe {

class ActorHost;

proto::Actor::Client rebinding(ActorHost& node, ActorAddress address, proto::Actor::Client direct);
// `direct` is the capability of `address`'s incarnation. Returns `direct` itself when the actor
// has no restart policy (address.restartable is false).

}  // namespace troupe
