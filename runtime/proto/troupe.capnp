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
  labels @8 :List(Label);         # user labels (troupe/node_size.h), sorted by key
  resources @9 :List(Resource);   # custom resources, sorted by name
  incarnation @10 :UInt32;
  # Which process of its host this is: 0 for the first, then 1, 2, ... for each one the
  # per-instance entry point started again (TROUPE_INCARNATION). A higher incarnation replaces a
  # node of the same host that the head still counts as alive; see Cluster.join.

  struct Label {
    key @0 :Text;
    value @1 :Text;
  }
  struct Resource {
    name @0 :Text;
    milli @1 :Int64;        # thousandths of a unit, as the scheduler counts them
  }
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

struct NodeLoad {
  # What a node reports with each heartbeat (the head measures its own on the same schedule): how
  # busy its process is, and how many calls wait at each of its actors.
  cpuPercent @0 :Float32;   # the process's CPU time over the interval, in % of one core
  intervalMs @1 :UInt32;    # the interval measured (0: none yet)
  actors @2 :List(ActorLoad);
  holds @3 :UInt32;         # actor method bodies that held the event loop past --stall-warn-ms
  longestHoldMs @4 :UInt32; # the longest of them, and whose it was: "'consumer' (probe.Probe #3)
  longestHoldBy @5 :Text;   # in Probe.work". In a report: since the previous one; in
                            # JobStatus: over the whole job.

  struct ActorLoad {
    id @0 :UInt64;
    incarnation @1 :UInt32;
    calls @2 :UInt32;       # calls that have arrived and not returned: queued + running
  }
}

struct JobStatus {
  # The head's view of a running job, for `troupe status`.
  head @0 :Text;            # the head's host
  headAddress @1 :Text;
  phase @2 :Text;           # "forming", "running" or "ending"
  uptimeMs @3 :UInt64;      # since the head started
  nodes @4 :List(NodeStatus);
  groups @5 :List(GroupStatus);
  actors @6 :List(ActorStatus);

  struct NodeStatus {
    info @0 :NodeInfo;
    state @1 :Text;         # "alive", "draining", "left", "lost" or "expected" (not joined yet)
    heartbeatAgeMs @2 :Int64;  # since its last heartbeat; -1 for the head and for expected nodes
    load @3 :NodeLoad;      # as of its last heartbeat
    loadAgeMs @4 :Int64;    # how old `load` is; -1: none yet
    why @5 :Text;           # why it was declared lost
  }
  struct GroupStatus {
    name @0 :Text;
    instanceType @1 :Text;
    hosts @2 :List(Text);
    alive @3 :UInt32;       # of those hosts, how many are alive nodes
  }
  struct ActorStatus {
    address @0 :ActorAddress;
    state @1 :Text;         # "starting" (not reported by its node yet), "running" or "stopping"
    calls @2 :Int64;        # queued + running calls at its node's last report; -1: not reported
    parent @3 :UInt64;      # 0: the driver
  }
}

interface Gate {
  # The bootstrap capability of every node's port.
  login @0 (token :Data, host :Text, incarnation :UInt32) -> (node :Node, cluster :Cluster);
  # Compares `token` with the cluster token in constant time. `cluster` is null on non-head nodes.
  # `host` and `incarnation` (NodeInfo.incarnation) name the caller's process, so that the
  # connection can be cut when the head declares it lost (Node.peerLost) without cutting a newer
  # process of the same host.
  status @1 (token :Data) -> (status :JobStatus, head :Text, headAddress :Text);
  # For `troupe status`, a client that is not a node: authenticated as login is (the TLS handshake,
  # or with --insecure `token`), it gets a snapshot of the job and nothing it could act with. A
  # worker answers with no `status` and where its head listens (`head`, `headAddress`).
}

interface Cluster {
  # Served by the head.
  join @0 (info :NodeInfo, node :Node) -> (nodeId :UInt32, heartbeatMs :UInt32,
                                           controlPort :UInt16);
  # `controlPort`: where the head's control thread listens (on the head's host), for the node's
  # heartbeats on the control path (ControlHello, below).
  heartbeat @1 (nodeId :UInt32, load :NodeLoad) -> (fenced :Bool, reason :Text);
  # The node's load report, on the node's schedule: its CPU use since the last one and its
  # actors' mailbox depths (troupe status). Liveness is not judged by it but on the control path.
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
  # Ends the job (INTERRUPTED unless `ok`).
  leave @10 (nodeId :UInt32, reason :Text);
  # The node received SIGTERM or SIGINT (a scale-down, a spot reclaim of that one instance). If
  # the head is not itself stopped within a short window (a stop of the whole job signals every
  # instance), the node is drained: it takes no new actors, its actors stop and restart elsewhere
  # under their placements, and the head tells it to exit 0. Otherwise the job ends as for
  # finish().
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
  peerLost @8 (host :Text, address :Text, reason :Text, incarnation :UInt32);
  # The head has declared another node lost: drop every connection to and from it, so that calls
  # in flight to its actors fail with DISCONNECTED now rather than wait on a socket that a network
  # partition never closes. Only connections from processes of `host` up to `incarnation` are
  # cut: a newer one may already have joined in its place.
  traceClock @9 () -> (micros :Int64);
  # This node's trace clock (troupe/trace.h now()): the head probes it to put every node's spans
  # on its own clock (docs/tracing.md).
  traceRead @10 (from :UInt64, max :UInt32) -> (chunk :TraceChunk);
  # At most `max` of the spans this node recorded, from index `from` on. The call with from = 0
  # takes the snapshot that later calls page through, and carries the row names.
  actorRestarted @11 (id :UInt64, incarnation :UInt32);
  # The head restarted actor `id` as `incarnation` (sent to every node before the monitors hear
  # of it): references to it on this node ask the head where it lives before their next call.
}

struct TraceEvent {
  name @0 :Text;
  category @1 :Text;
  row @2 :UInt64;       # Chrome's tid: an actor's row or a thread's
  start @3 :Int64;      # microseconds on the node's trace clock
  duration @4 :Int64;   # microseconds
}

struct TraceRow {
  row @0 :UInt64;
  name @1 :Text;
}

struct TraceChunk {
  events @0 :List(TraceEvent);
  rows @1 :List(TraceRow);  # only in the chunk from 0
  total @2 :UInt64;         # spans in the snapshot
  dropped @3 :UInt64;       # spans the node dropped because a thread's buffer was full
  capacity @4 :UInt64;      # spans one thread's buffer holds
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

# The control path (runtime/src/control/control.h): a connection of its own between a worker's
# control thread and the head's, carrying only these framed messages, never RPC. The worker sends
# a hello, then a beat every heartbeat interval; the head answers each beat at once.
struct ControlHello {
  nodeId @0 :UInt32;  # as the head's join answered
  token @1 :Data;     # the job secret, with --insecure only (TLS proves it otherwise)
}

struct ControlBeat {
  seq @0 :UInt64;
}

struct ControlAck {
  seq @0 :UInt64;
  fenced @1 :Bool;    # the head has declared this node lost: exit FENCED at once
  reason @2 :Text;
}
