@0xc88c11f2136f4b0a;
# troupe's wire protocol: cluster formation, node control and the actor lifecycle.
#
# Every node listens on one TCP port whose bootstrap capability is a Gate: nothing else is reachable
# before the peer proves it holds the cluster token. The head serves Cluster (the directory, the
# scheduler and the lifecycle state machine); every node, the head included, serves Node (it hosts
# actors). Actor references are capabilities; one that crosses nodes travels as an ActorAddress and
# is resolved on a direct connection to the owning node, because Cap'n Proto 0.9.2 has no
# three-party hand-off (a capability passed A -> B -> C would be proxied through B).
#
# User actor interfaces extend Actor:
#   using Troupe = import "/troupe.capnp";
#   interface Greeter extends(Troupe.Actor) { ... }

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::proto");

struct ExitReason {
  # Why an actor (or a job) ended. `normal` and `shutdown` are normal exits: they do not propagate
  # through links. Every other kind is abnormal.
  kind @0 :Kind;
  text @1 :Text;
  # One line a person can act on: which actor, on which host, and why.

  enum Kind {
    normal @0;    # the actor finished its work
    shutdown @1;  # stopped by its parent, the job's end, or a stop() call
    failed @2;    # threw, or asked to exit with an error
    killed @3;    # did not stop within its deadline and was dropped
    nodeLost @4;  # the node hosting it was lost
    noActor @5;   # monitor() of an id that never existed
  }
}

struct ActorAddress {
  # Where an actor lives. Resolve it with Node.resolve() on a direct connection to `address`.
  id @0 :UInt64;
  incarnation @1 :UInt32;   # bumped on every restart
  nodeId @2 :UInt32;
  host @3 :Text;            # e.g. "algo-2"
  group @4 :Text;           # the instance group of that host
  address @5 :Text;         # "ip:port" of the owning node's listener
  typeName @6 :Text;
  name @7 :Text;            # empty when unnamed
  restartable @8 :Bool;     # it has a restart policy: references to it re-resolve after a restart
}

struct NodeInfo {
  host @0 :Text;
  group @1 :Text;
  instanceType @2 :Text;
  address @3 :Text;         # "ip:port" this node listens on
  vcpus @4 :UInt32;
  gpus @5 :UInt32;
  memoryBytes @6 :UInt64;
  pid @7 :UInt32;
}

struct SpawnSpec {
  typeName @0 :Text;        # as registered with troupe::Registry
  name @1 :Text;            # optional; named actors can be found with Cluster.lookup()
  args @2 :Data;            # a serialized Cap'n Proto message of the type's own argument struct
  placement @3 :Text;       # troupe::sched::Placement in its textual form
  parent @4 :UInt64;        # 0 = the driver (the root of the tree)
  link @5 :Bool = true;     # link to the parent: an abnormal exit escalates to it
  maxRestarts @6 :UInt32;   # restarts allowed within restartWindowMs before escalating
  restartWindowMs @7 :UInt32 = 60000;
  stopTimeoutMs @8 :UInt32 = 5000;  # after this, a stopping actor is killed
  index @9 :UInt32;         # which instance of a multi-instance spawn (0-based) ...
  count @10 :UInt32 = 1;    # ... out of how many
  maxConcurrency @11 :UInt32 = 1;
  # The actor's mailbox: how many of its calls may run at once (1: one at a time, in arrival
  # order; 0: no limit). Methods annotated $concurrent and the Actor interface's own methods
  # never wait in it.
  failCallOnly @12 :Bool;
  # An exception escaping a method fails only that call (the actor runs on); by default it fails
  # the actor, subject to its restart policy.
  callDeadlineMs @13 :UInt32;
  # Each call must return within this long of arriving (mailbox wait included), else it is
  # cancelled and fails with OVERLOADED naming the actor and the method. 0: no deadline.
  waitForCapacityMs @14 :UInt32;
  # A spawn that does not fit now waits up to this long for capacity (an actor exiting, a node
  # joining) instead of failing at once. 0: fail at once.
}

annotation concurrent @0xd6a4c2e1f3b50917 (method) :Void;
# On a method of an actor interface: its calls do not wait in the actor's mailbox and do not hold
# it; they run at once, beside whatever call holds the actor (a query such as progress(), or a
# long-lived call that other calls must reach the actor during, such as a producer's stream).

interface Gate {
  # The bootstrap capability of every node's port.
  login @0 (token :Data, host :Text) -> (node :Node, cluster :Cluster);
  # Compares `token` with the cluster token in constant time. `cluster` is null on non-head nodes.
  # `host` names the caller's host, so that the connection can be cut when the head declares that
  # host lost (Node.peerLost).
}

interface Cluster {
  # Served by the head.
  join @0 (info :NodeInfo, node :Node) -> (nodeId :UInt32, heartbeatMs :UInt32);
  heartbeat @1 (nodeId :UInt32) -> (fenced :Bool, reason :Text);
  # `fenced`: the head has declared this node lost; it must exit (FENCED) at once.
  spawn @2 (spec :SpawnSpec) -> (actors :List(ActorAddress));
  # Places and starts one actor, or several for a multi-instance placement (onePerNode, perVcpu).
  resolve @3 (id :UInt64) -> (actor :ActorAddress);
  # The current incarnation of an actor.
  lookup @4 (name :Text) -> (actor :ActorAddress);
  actorExited @5 (id :UInt64, incarnation :UInt32, reason :ExitReason);
  # A node reports an actor that ended by itself.
  link @6 (a :UInt64, b :UInt64);
  monitor @7 (target :UInt64, watcher :Watcher);
  stop @8 (id :UInt64);
  # Stops an actor and its children (the cascade).
  finish @9 (ok :Bool, reason :Text);
  # Ends the job, e.g. because a node received SIGTERM.
}

interface Node {
  # Served by every node.
  host @0 (spec :SpawnSpec, address :ActorAddress) -> (actor :Actor);
  resolve @1 (id :UInt64) -> (actor :Actor);
  stop @2 (id :UInt64, reason :ExitReason, timeoutMs :UInt32);
  # Runs the actor's onStop() within the deadline, then drops it; calls in flight fail.
  kill @3 (id :UInt64, reason :ExitReason);
  exit @4 (status :Int32, reason :Text);
  # Stops what the node still hosts; the process exits with `status` after replying.
  ping @5 ();
  headActors @6 (actors :List(ActorAddress));
  # The head tells every worker which actors it hosts itself, so that a worker that loses the head
  # can say what was lost with it ("and with it 'trainer' (train.Trainer #1)").
  fence @7 (reason :Text);
  # The head has declared this node lost and restarted its actors elsewhere: the node exits with
  # FENCED at once, without stopping anything (its actors belong to the cluster no more).
  peerLost @8 (host :Text, address :Text, reason :Text);
  # The head has declared another node lost: drop every connection to and from it, so that calls
  # in flight to its actors fail with DISCONNECTED now rather than wait on a socket that a network
  # partition never closes.
}

interface Actor {
  # The base of every actor interface.
  stop @0 ();
  link @1 (other :UInt64);
  monitor @2 (watcher :Watcher);
  info @3 () -> (address :ActorAddress);
}

interface Watcher {
  down @0 (id :UInt64, reason :ExitReason);
  # Exactly once per monitor, also when monitoring started after the death.
  restarted @1 (id :UInt64, incarnation :UInt32, reason :ExitReason);
  # The actor exited abnormally and its restart policy started incarnation `incarnation` in its
  # place; `reason` is why the previous one ended. Sent before any later `down`.
}
