// The table of the fault matrix: one row per case, with what it does and what it must end with.
// Codes are troupe::ExitCode or 128 + a signal; bounds count from the moment of the injection. The
// runtime's defaults: heartbeat 500 ms, node timeout 3000 ms, head timeout 5000 ms, actor stop
// deadline 5 s.

#include <signal.h>

#include <algorithm>

#include <troupe/exit_codes.h>

#include "fault_case.h"
#include "inject.h"

namespace faults {

namespace {

using namespace troupe;  // the ExitCode names

constexpr int kComplete = 180;  // a job that must still complete: 2 short epochs, slowly
constexpr int kTerm = 30;       // a graceful cascade: stop deadline 5 s, with room for a slow CI
constexpr int kHeadLost = 15;   // head timeout 5 s + 10 s
// A cut that heals: the job runs long enough for the cut node to give up, start again and rejoin.
constexpr size_t kHealEpochs = 30;
constexpr size_t kLongHealEpochs = 60;  // a cut of 24-30 s

// Case::netns and Case::quick, by name.
constexpr bool kLoopback = false, kNetns = true;
constexpr bool kSoakOnly = false, kQuick = true;

RoleExpect codes(std::set<int> allowed, int withinS = kComplete) {
  return RoleExpect{std::move(allowed), withinS};
}

// Every role the same. (Built by assignment: g++ 12 warns about designated initializers that
// leave a std::set member to its default.)
Expect every(RoleExpect all, int withinS, std::string why) {
  Expect e;
  e.head = e.victim = e.workers = all;
  e.withinS = withinS;
  e.why = std::move(why);
  return e;
}

// A job of `epochs` epochs that must complete: kComplete, or 12 s an epoch where that is longer
// (an epoch of 12,000 samples took 7-9 s under ASan on 2 cores once a lost node's augmenters ran
// on the trainer's CPU; 30 of them outlast 180 s without anything hanging).
Expect completes(std::string why, size_t epochs = Setting().epochs) {
  int withinS = std::max(kComplete, int(epochs) * 12);
  return every(codes({OK}, withinS), withinS, std::move(why));
}

Expect interrupted() {
  return every(codes({INTERRUPTED}, kTerm), kTerm,
               "SIGTERM on any node ends the job gracefully: every node exits 6 (INTERRUPTED) "
               "with output/failure");
}

Expect headKilled() {
  auto e = every(codes({HEAD_LOST}, kHeadLost), kHeadLost + 5,
                 "a worker that loses the head exits 3 (HEAD_LOST) within the head timeout");
  e.head = codes({128 + SIGKILL}, kHeadLost);
  return e;
}

Expect simKilled() {
  auto e = every(codes({}, 5), 5,
                 "every instance dies with the simulator, even when it is killed by SIGKILL");
  e.sim = 128 + SIGKILL;
  return e;
}

// A data instance is lost for good: the job goes on without it.
Expect dataLost(std::set<int> victim, int victimWithinS, std::string why) {
  auto e = completes(std::move(why));
  e.victim = codes(std::move(victim), victimWithinS);
  return e;
}

// A partition that heals before the node timeout: the job completes exactly-once and every host
// ends with 0. A node on the far side may still be fenced: TCP retransmits on a backed-off timer
// (about 0.2, 0.6, 1.4, 3.0 s after the loss), so after a link is down for more than ~1.4 s the
// first heartbeat can arrive 3 s after the last one, past the node timeout. Its process is then
// started again and rejoins (--node-restarts), so its host's final code is 0 all the same; losing
// it costs throughput, never samples (docs/lifecycle.md). (This accepted a final 7 before.)
Expect healed(std::string why) { return completes(std::move(why)); }

// The head is cut off or stalled for longer than the head timeout: the workers leave on their
// own; the head may finish the job alone or fail it.
Expect headLost(std::string why) {
  auto e = every(codes({HEAD_LOST, FENCED}, kHeadLost), kComplete, std::move(why));
  e.head = codes({OK, JOB_FAILED});
  return e;
}

// The head cut off for good: each worker gives up on it (3) and is started again, and the new
// process tries to rejoin for the join deadline (60 s: a cut may heal, docs/lifecycle.md) before
// it exits 5 and leaves the 3. The head may finish the job alone meanwhile; troupe sim then
// SIGTERMs what still runs --linger-ms (15 s) later, and a process stopped before it rejoined
// exits 6 (INTERRUPTED) with its failure file.
Expect headCutOff(std::string why) {
  auto e = headLost(std::move(why));
  // 0: a worker's process started again (after its 3) and stopped by the sim while it rejoins is
  // drained (docs/lifecycle.md): the job's outcome is the head's.
  e.workers = codes({HEAD_LOST, FENCED, INTERRUPTED, OK}, kHeadLost + 60 + 10);
  e.withinS = std::max(e.withinS, e.workers.withinS);
  return e;
}

// The victim's process is started again (troupe sim --node-restarts, as the per-instance entry
// point does): it rejoins as a new incarnation, gets augmenters, and every host ends with 0.
Expect rejoins(std::string why, size_t epochs = Setting().epochs) {
  auto e = completes(std::move(why), epochs);
  e.rejoins = true;
  return e;
}

// A lost process stays lost: the case watches what its loss does (no --node-restarts).
const std::vector<std::string> kNoRestarts = {"--node-restarts", "0"};

Setting noRestarts(Setting s = {}) {
  s.simArgs = kNoRestarts;
  return s;
}

Setting restartsOnce() {
  Setting s;
  s.simArgs = {"--node-restarts", "1"};
  return s;
}

// The head stalls past the head timeout, then runs again: the workers give up on it (3), their
// processes are started again and keep trying to rejoin (the join deadline, 60 s, is longer than
// any stall of this row), so the job completes and every host ends with 0. (It accepted 3, 7 and
// a failed job before: the outcome this row exists to catch.)
Expect headComesBack(std::string why) { return completes(std::move(why)); }

Setting starting(int withinMs) {
  Setting s;
  s.when = When::STARTING;
  s.startMs = withinMs;
  return s;
}

Setting startingWithOne(int withinMs) {
  auto s = noRestarts(starting(withinMs));
  s.appArgs = {"--start-with", "data_group=1"};
  return s;
}

// A job long enough that a process cut off for 6 s can still rejoin it (30 epochs: about 25 s).
Setting longer(size_t epochs) {
  Setting s;
  s.epochs = epochs;
  return s;
}

Setting formed() {
  Setting s;
  s.when = When::FORMED;
  return s;
}

Setting loaded(int hogsPerCore) {
  Setting s;
  s.hogsPerCore = hogsPerCore;
  return s;
}

// `data` data instances of one vCPU's worth of augmenters each (augmentation stays what 2-core
// hardware can run), and the dnn instance.
Setting wide(int data) {
  Setting s;
  s.groups = {"data_group=" + std::to_string(data) + ":ml.c5.xlarge", "dnn_group=1:ml.p3.2xlarge"};
  s.appArgs = {"--augmenters-per-node", "1"};
  return s;
}

std::vector<Case> makeCases() {
  using T = const Target&;
  return {
      {"data-kill9", "kill -9 a data instance", Role::DATA, kLoopback, kQuick,
       [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       dataLost({128 + SIGKILL}, kComplete,
                "losing a data instance costs throughput, never samples or the job"),
       noRestarts()},
      {"data-kill9-rejoin", "kill -9 a data instance; troupe sim starts it again", Role::DATA,
       kLoopback, kQuick, [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       rejoins("a data node process started again rejoins the job and gets work: exactly-once, "
               "every host ends with 0"),
       restartsOnce()},

      {"head-kill9", "kill -9 the head (the trainer's instance)", Role::HEAD, kLoopback, kQuick,
       [](T t, Rng&) { return signalOne(t.head, SIGKILL); }, headKilled()},
      {"head-sigterm", "SIGTERM to the head", Role::HEAD, kLoopback, kQuick,
       [](T t, Rng&) { return signalOne(t.head, SIGTERM); }, interrupted()},
      {"data-sigterm", "SIGTERM to one data instance (a drain)", Role::DATA, kLoopback, kQuick,
       [](T t, Rng&) { return signalOne(t.victim, SIGTERM); },
       completes("SIGTERM to one data instance alone is a drain: its work moves to the others "
                 "and it exits 0; the job completes exactly-once")},
      {"data-sigterm-frozen", "SIGTERM to one data instance, then SIGSTOP it 8 s mid-drain",
       Role::DATA, kLoopback, kSoakOnly,
       [](T t, Rng& r) { return drainThenFreeze(t.victim, r, 8000); },
       completes("a data instance lost while it drains ends as a drained one (0), not fenced "
                 "(7, a Failed job on SageMaker): its work moved on; the job completes "
                 "exactly-once"),
       noRestarts()},
      {"all-sigterm", "SIGTERM to every instance at once", Role::SIM, kLoopback, kSoakOnly,
       [](T t, Rng&) { return signalAll(t, SIGTERM); }, interrupted()},
      {"sim-sigterm", "SIGTERM to troupe sim", Role::SIM, kLoopback, kSoakOnly,
       [](T t, Rng&) { return signalSim(t, SIGTERM); }, interrupted()},
      {"sim-kill9", "kill -9 troupe sim", Role::SIM, kLoopback, kSoakOnly,
       [](T t, Rng&) { return signalSim(t, SIGKILL); }, simKilled()},
      {"data-stop-short", "SIGSTOP a data instance for 0.5-2 s (< node timeout)", Role::DATA,
       kLoopback, kSoakOnly, [](T t, Rng& r) { return freeze(t.victim, r, 500, 2000); },
       completes("a data instance that stalls for less than the node timeout is not lost")},
      {"data-stop-long", "SIGSTOP a data instance for 4-8 s (> node timeout)", Role::DATA,
       kLoopback, kQuick, [](T t, Rng& r) { return freeze(t.victim, r, 4000, 8000); },
       dataLost({FENCED}, 8 + 10,
                "a data node declared lost is fenced: it exits 7 (FENCED) and the job goes on "
                "without it, exactly-once"),
       noRestarts()},
      {"head-stop-short", "SIGSTOP the head for 1-4 s (< head timeout)", Role::HEAD, kLoopback,
       kSoakOnly, [](T t, Rng& r) { return freeze(t.head, r, 1000, 4000); },
       completes("a head that stalls for less than the head timeout must not kill a healthy job")},
      {"head-stop-long", "SIGSTOP the head for 6-8 s (> head timeout)", Role::HEAD, kLoopback,
       kSoakOnly, [](T t, Rng& r) { return freeze(t.head, r, 6000, 8000); },
       headComesBack("workers that lose a stalled head exit on their own (3), are started again "
                     "and rejoin once it runs again: the job completes, every host 0")},
      {"data-partition-long", "take a data instance's link down for good", Role::DATA, kNetns,
       kQuick, [](T t, Rng& r) { return partition(t, t.victim, r, 0, -1); },
       dataLost({HEAD_LOST, FENCED}, kHeadLost,
                "a partitioned data instance is lost: the job goes on without it, exactly-once, "
                "and it exits on its own (3 or 7)"),
       noRestarts()},
      {"data-partition-heals", "take a data instance's link down for 6 s, then up", Role::DATA,
       kNetns, kQuick, [](T t, Rng& r) { return partition(t, t.victim, r, 6000, 6000); },
       rejoins("a data instance cut off past the timeouts is started again when it gives up "
               "on the head, and rejoins once its link is back: every host ends with 0, "
               "exactly-once",
               kHealEpochs),
       longer(kHealEpochs)},
      {"data-partition-heals-25s", "take a data instance's link down for 24-30 s, then up",
       Role::DATA, kNetns, kSoakOnly,
       [](T t, Rng& r) { return partition(t, t.victim, r, 24000, 30000); },
       rejoins("a cut past the head timeout plus a restarted process's old 11 s wait: it keeps "
               "trying while the job runs and rejoins once the link is back, every host ends "
               "with 0, exactly-once",
               kLongHealEpochs),
       longer(kLongHealEpochs)},
      {"data-slow-link", "limit a data instance's link to 8 Mbit/s for 6-10 s (tc tbf)", Role::DATA,
       kNetns, kQuick, [](T t, Rng& r) { return slowLink(t, t.victim, r, 6000, 10000); },
       completes("a slow but live data instance is not fenced (liveness has its own connection): "
                 "the job completes, every instance exits 0, exactly-once")},
      {"data-partition-short", "take a data instance's link down for 0.5-2 s", Role::DATA, kNetns,
       kSoakOnly, [](T t, Rng& r) { return partition(t, t.victim, r, 500, 2000); },
       healed("a partition shorter than the node timeout loses no sample and not the job")},
      {"head-partition-long", "take the head's link down for good", Role::HEAD, kNetns, kSoakOnly,
       [](T t, Rng& r) { return partition(t, t.head, r, 0, -1); },
       headCutOff("workers cut off from the head exit on their own (3 or 7), or 6 (0 for a "
                  "process started again, a drain while it rejoins) when the sim stops them "
                  "after the head finished alone; the head ends too")},
      {"head-partition-short", "take the head's link down for 0.5-2 s", Role::HEAD, kNetns,
       kSoakOnly, [](T t, Rng& r) { return partition(t, t.head, r, 500, 2000); },
       healed("a partition shorter than the node timeout loses no sample and not the job")},
      {"head-garbage", "garbage bytes, silent and huge-prefix connections on the head's port",
       Role::HEAD, kLoopback, kQuick, [](T t, Rng& r) { return garbage(t.head, r); },
       completes("garbage on a node's port is dropped: the job completes, exactly-once")},
      {"data-garbage", "garbage bytes, silent and huge-prefix connections on a data port",
       Role::DATA, kLoopback, kSoakOnly, [](T t, Rng& r) { return garbage(t.victim, r); },
       completes("garbage on a node's port is dropped: the job completes, exactly-once")},
      {"all-sigterm-early", "SIGTERM to every instance in its first 500 ms", Role::SIM, kLoopback,
       kQuick, [](T t, Rng&) { return signalAll(t, SIGTERM); }, interrupted(), starting(500)},
      {"head-sigterm-twice", "SIGTERM to the head twice, 10-50 ms apart", Role::HEAD, kLoopback,
       kSoakOnly, [](T t, Rng& r) { return signalTwice(t.head, r, 10, 50); }, interrupted()},
      {"data-kill9-forming", "kill -9 a data instance before it joins (--start-with data_group=1)",
       Role::DATA, kLoopback, kSoakOnly, [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       dataLost({128 + SIGKILL}, 5,
                "with --start-with data_group=1 the job starts without a data instance that "
                "died before it joined: it completes exactly-once"),
       startingWithOne(150)},
      {"data-kill9-formed", "kill -9 a data instance after the cluster formed, before step 1",
       Role::DATA, kLoopback, kSoakOnly, [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       dataLost({128 + SIGKILL}, kComplete,
                "a data instance lost before training costs throughput, never samples or the job"),
       noRestarts(formed())},
      {"data-kill9-loaded", "kill -9 a data instance, CPUs oversubscribed by 3 busy loops a core",
       Role::DATA, kLoopback, kSoakOnly, [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       dataLost({128 + SIGKILL}, kComplete,
                "on a saturated CPU no healthy node is declared lost: the job completes "
                "exactly-once, every other instance exits 0"),
       noRestarts(loaded(3))},
      {"data-kill9-64", "kill -9 one data instance of 64 instances", Role::DATA, kLoopback,
       kSoakOnly, [](T t, Rng&) { return signalOne(t.victim, SIGKILL); },
       dataLost({128 + SIGKILL}, kComplete,
                "losing one of 63 data instances costs throughput, never samples or the job"),
       noRestarts(wide(63))},
  };
}

}  // namespace

const std::vector<Case>& allCases() {
  static const std::vector<Case> cases = makeCases();
  return cases;
}

const Case* findCase(std::string_view name) {
  for (auto& c : allCases()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace faults
