@0x9296125b503d0947;
# A test actor for the integration tests: it reports where it runs, and can crash, finish, spawn
# children and refuse to stop on command.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("probe");

using Troupe = import "/troupe.capnp";

struct ProbeArgs {
  label @0 :Text;
  hangOnStop @1 :Bool;   # onStop() never finishes: the stop deadline must kill it
}

interface Probe extends(Troupe.Actor) {
  ping @0 () -> (host :Text, group :Text, incarnation :UInt32, pid :UInt32);
  crash @1 (why :Text);
  finish @2 ();
  spawnChildren @3 (count :UInt32) -> (ids :List(UInt64));
  echo @4 (payload :Data) -> (payload :Data);
  failWhen @5 (when :FailPoint, why :Text) -> (value :UInt32);
  # Calls context().fail(why) at that point of the method, then returns value 42 if it can.
  hold @6 (ms :UInt32, tag :Text) -> (peak :UInt32, log :Text);
  # Stays in the call for `ms` (awaiting a timer); `peak`: the most hold() calls running at once
  # on this actor while this one ran; `log`: this actor's enter/leave events so far ("+a -a +b").
  depth @7 () -> (depth :UInt64, running :UInt32) $Troupe.concurrent;
  # The actor's mailbox: calls arrived and not returned, and of those how many run now.
  throwNow @8 (why :Text);
  # An exception escapes the method.
  die @9 ();
  # SIGKILL to the whole instance the actor runs on: a node lost with everything on it.
  work @10 (payload :Data, spinUs :UInt32) -> (bytes :UInt64);
  # Spins `spinUs` microseconds inline, holding its node's event loop as user code that does its
  # work in the method does; answers the payload's size.
  feed @11 (consumer :Text, count :UInt32, bytes :UInt32, spinUs :UInt32, window :UInt32)
        -> (sent :UInt64, bytes :UInt64) $Troupe.concurrent;
  # Looks up the actor named `consumer` and calls its work() `count` times with `bytes` of
  # payload, `window` calls in flight; `sent`: calls answered, `bytes`: the sizes it answered.
  populate @12 (mb :UInt32) -> (ms :UInt32);
  # Maps `mb` MiB with MAP_POPULATE and unmaps it: one system call that spends a long time in the
  # kernel (zeroing the pages), as a large read, a page reclaim or a big unmap does. `ms`: its time.
}

enum FailPoint {
  beforeSuspending @0;  # in the method body, before any promise
  afterCoAwait @1;      # in a coroutine, after a co_await
  inContinuation @2;    # in a .then() continuation
  onPoolReturn @3;      # in the continuation of offload(), while the pool job has returned
}

# An interface no registered class serves: a reference cast to it must fail naming the actor.
interface Other extends(Troupe.Actor) {
  nothing @0 ();
}
