// probe_app's runtime scenarios (probe_app.h): placement, mailboxes, deadlines, capacity waits,
// gangs, stalls, errors.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include <spdlog/spdlog.h>

#include "probe_app.h"

namespace probe_app {

namespace {


// A preference for a group the cluster lacks (a typo, or a homogeneous cluster): placed anyway,
// with a warning that names the groups there are.
kj::Promise<void> preferUnknown(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::prefer("data_grup").cpus(0),
                                   labelled("u"));
  return a.pingRequest().send().then(
      [](auto r) { say(std::string("PLACED on ") + r.getGroup().cStr()); });
}

kj::Promise<void> unregistered(Job& job) {
  job.spawn<probe::Probe>("no.SuchType", troupe::Placement::any());
  return kj::READY_NOW;
}

kj::Promise<void> unplaceable(Job& job) {
  job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("dnn_group").gpus(64));
  return kj::READY_NOW;
}

// context().fail() from every point of a method: each call fails with the reason, and the node
// (another actor on it) lives on.
troupe::Co<void> failAnywhere(Job& job) {
  auto where = troupe::Placement::group("data_group").cpus(0);
  auto bystander = job.spawn<probe::Probe>("probe.Probe", where, labelled("bystander"));
  auto bystanderHost = bystander.address().host;
  for (auto when : {probe::FailPoint::BEFORE_SUSPENDING, probe::FailPoint::AFTER_CO_AWAIT,
                    probe::FailPoint::IN_CONTINUATION, probe::FailPoint::ON_POOL_RETURN}) {
    auto name = "f" + std::to_string(static_cast<int>(when));
    auto victim = job.spawn<probe::Probe>(
        "probe.Probe", troupe::Placement::any().labels("host=" + bystanderHost).cpus(0),
        labelled(name).unlinked());
    auto req = victim.failWhenRequest();
    req.setWhen(when);
    req.setWhy("fault " + name);
    try {
      auto r = co_await req.send();
      say("FAIL " + name + " RETURNED " + std::to_string(r.getValue()));
    } catch (const kj::Exception& e) {
      bool typed = e.getType() == kj::Exception::Type::DISCONNECTED;
      say("FAIL " + name + (typed ? " DISCONNECTED " : " OTHER ") + e.getDescription().cStr());
    }
    auto why = co_await job.monitor(victim.id());
    say("FAIL " + name + " EXIT " + why.describe());
    auto ping = co_await bystander.pingRequest().send();
    say("FAIL " + name + " NODE ALIVE pid " + std::to_string(ping.getPid()));
  }
}

// The mailbox: two calls sent at once to a default actor run one after the other, in arrival order;
// meanwhile its mailbox holds both, one running.
troupe::Co<void> mailbox(Job& job) {
  auto m = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("m"));
  co_await m.pingRequest().send();
  auto a = m.holdRequest();
  a.setMs(400);
  a.setTag("a");
  auto b = m.holdRequest();
  b.setMs(400);
  b.setTag("b");
  auto ra = a.send();
  auto rb = b.send();
  co_await job.timer().afterDelay(150 * kj::MILLISECONDS);
  auto d = co_await m.depthRequest().send();
  say("DEPTH " + std::to_string(d.getDepth()) + " RUNNING " + std::to_string(d.getRunning()));
  auto first = co_await kj::mv(ra);
  auto second = co_await kj::mv(rb);
  say("MAILBOX a peak " + std::to_string(first.getPeak()) + " b peak " +
      std::to_string(second.getPeak()) + " log " + second.getLog().cStr());
}

// maxConcurrency(4): five calls sent at once, four run together, the fifth once one returned.
troupe::Co<void> concurrency(Job& job) {
  auto c = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("c").maxConcurrency(4));
  co_await c.pingRequest().send();
  auto calls = kj::heapArrayBuilder<kj::Promise<capnp::Response<probe::Probe::HoldResults>>>(5);
  for (int i = 0; i < 5; ++i) {
    auto req = c.holdRequest();
    req.setMs(600);
    req.setTag("c" + std::to_string(i));
    calls.add(req.send());
  }
  co_await job.timer().afterDelay(250 * kj::MILLISECONDS);
  auto d = co_await c.depthRequest().send();
  say("DEPTH " + std::to_string(d.getDepth()) + " RUNNING " + std::to_string(d.getRunning()));
  uint32_t peak = 0;
  std::string log;
  for (auto& call : calls.finish()) {
    auto r = co_await kj::mv(call);
    peak = std::max(peak, r.getPeak());
    log = r.getLog().cStr();
  }
  say("CONCURRENCY peak " + std::to_string(peak) + " log " + log);
}

// A supervisor's view: a monitor hears of each restart, then one down.
troupe::Co<void> restartNotices(Job& job) {
  auto r = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("r").restarts(2, 60 * kj::SECONDS).unlinked());
  auto down = job.monitor(r.id(), [](const troupe::Restarted& n) {
    say("RESTARTED #" + std::to_string(n.id) + " incarnation " + std::to_string(n.incarnation) +
        " after " + n.reason.describe());
  });
  for (uint32_t want = 1; want <= 3; ++want) {
    for (;;) {  // until the reference reaches incarnation `want`
      try {
        auto ping = r.pingRequest();
        auto p = co_await ping.send();
        if (p.getIncarnation() == want) break;
      } catch (const kj::Exception&) {
      }
      co_await job.timer().afterDelay(30 * kj::MILLISECONDS);
    }
    try {
      auto t = r.throwNowRequest();
      t.setWhy("throw " + std::to_string(want));
      co_await t.send();
      say("THROW RETURNED");
    } catch (const kj::Exception& e) {
      say(std::string("THROW FAILED ") + e.getDescription().cStr());
    }
  }
  auto why = co_await kj::mv(down);
  say("DOWN " + why.describe());
}

// MethodError::FAIL_CALL: the exception fails the call; the actor runs on.
troupe::Co<void> failCallOnly(Job& job) {
  auto k = job.spawn<probe::Probe>(
      "probe.Probe", troupe::Placement::any().cpus(0),
      labelled("k").unlinked().onMethodError(troupe::MethodError::FAIL_CALL));
  try {
    auto t = k.throwNowRequest();
    t.setWhy("keep running");
    co_await t.send();
    say("THROW RETURNED");
  } catch (const kj::Exception& e) {
    say(std::string("THROW FAILED ") + e.getDescription().cStr());
  }
  auto p = co_await k.pingRequest().send();
  say("ALIVE incarnation " + std::to_string(p.getIncarnation()));
}

// A 3 s hold through `ref`, which a deadline should cut: says "<label> OVERLOADED after N ms:
// <why>" (or RETURNED, or "other" for another error).
troupe::Co<void> holdPastDeadline(Job& job, troupe::Ref<probe::Probe> ref, const char* tag,
                                  std::string label) {
  auto started = job.timer().now();
  try {
    auto h = ref.holdRequest();
    h.setMs(3000);
    h.setTag(tag);
    co_await h.send();
    say(label + " RETURNED");
  } catch (const kj::Exception& e) {
    auto ms = (job.timer().now() - started) / kj::MILLISECONDS;
    say(label + " " + (e.getType() == kj::Exception::Type::OVERLOADED ? "OVERLOADED" : "other") +
        " after " + std::to_string(ms) + " ms: " + e.getDescription().cStr());
  }
}

// Deadlines: the actor's default (SpawnOptions::callDeadline) and a caller's (Ref::within).
troupe::Co<void> deadlines(Job& job) {
  auto slow = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                      labelled("slow").callDeadline(300 * kj::MILLISECONDS));
  co_await holdPastDeadline(job, slow, "x", "DEFAULT");
  // The cancelled call gave its place in the mailbox back.
  auto quick = slow.holdRequest();
  quick.setMs(10);
  quick.setTag("y");
  co_await quick.send();
  say("AFTER DEADLINE OK");

  auto free =
      job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("free"));
  co_await holdPastDeadline(job, free.within(200 * kj::MILLISECONDS), "z", "PERCALL");
  auto h = free.within(5 * kj::SECONDS).holdRequest();
  h.setMs(50);
  h.setTag("w");
  auto r = co_await h.send();
  say(std::string("WITHIN OK log ") + r.getLog().cStr());
}

// --stop-timeout-ms: an actor whose onStop() never finishes, spawned without stopTimeout(), is
// killed after the instance's --stop-timeout-ms.
troupe::Co<void> stopTimeout(Job& job) {
  auto s = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("stuck", true));
  co_await s.pingRequest().send();
  auto started = job.timer().now();
  co_await job.stop(s.id());
  say("STOP TOOK " + std::to_string((job.timer().now() - started) / kj::MILLISECONDS) + " ms");
}

// The job's end held open: an actor on a data node whose onStop() never finishes is left running
// when the driver returns, so the end waits --stop-timeout-ms for it; meanwhile the head refuses
// a joining process with "the job is ending" (membership_test).
troupe::Co<void> endSlowly(Job& job) {
  auto s = job.spawn<probe::Probe>("probe.Probe",
                                   troupe::Placement::group("data_group").cpus(0),
                                   labelled("stuck", true));
  co_await s.pingRequest().send();
  say("ENDING");
}

// A log that nobody reads: READY, then 2 s later (the test has stopped the sim, which reads the
// instances' output, by then) 4,000 log lines of 200 bytes, far past a pipe's 64 KiB, then 8 s
// more of the job, with a line a second. The node must not block on its log (loop/log_sink.h).
troupe::Co<void> logFlood(Job& job) {
  say("READY");
  co_await job.timer().afterDelay(2 * kj::SECONDS);
  std::string filler(160, 'x');
  for (int i = 0; i < 4000; ++i) spdlog::info("flood line {} {}", i, filler);
  for (int i = 0; i < 8; ++i) {
    co_await job.timer().afterDelay(1 * kj::SECONDS);
    spdlog::info("after the flood, second {}", i + 1);
  }
}

// Waiting for capacity: the dnn node has one GPU. A second GPU actor waits until the first is
// stopped; a third gives up after its wait, with the reason; one that could never fit fails at
// once.
troupe::Co<void> capacityWait(Job& job) {
  auto gpu = troupe::Placement::group("dnn_group").cpus(0).gpus(1);
  auto first = job.spawn<probe::Probe>("probe.Probe", gpu, labelled("g1"));
  co_await first.pingRequest().send();
  auto started = job.timer().now();
  auto second = job.spawnAsync<probe::Probe>("probe.Probe", gpu,
                                             labelled("g2").waitForCapacity(10 * kj::SECONDS));
  co_await job.timer().afterDelay(600 * kj::MILLISECONDS);
  say("STOPPING g1");
  co_await job.stop(first.id());
  auto g2 = co_await kj::mv(second);
  auto where = co_await g2.pingRequest().send();
  say("G2 PLACED after " + std::to_string((job.timer().now() - started) / kj::MILLISECONDS) +
      " ms on " + where.getHost().cStr());
  started = job.timer().now();
  try {
    co_await job.spawnAsync<probe::Probe>("probe.Probe", gpu,
                                          labelled("g3").waitForCapacity(400 * kj::MILLISECONDS));
    say("G3 PLACED");
  } catch (const kj::Exception& e) {
    say(std::string("G3 ") +
        (e.getType() == kj::Exception::Type::OVERLOADED ? "OVERLOADED" : "other") + " after " +
        std::to_string((job.timer().now() - started) / kj::MILLISECONDS) +
        " ms: " + e.getDescription().cStr());
  }
  started = job.timer().now();
  try {
    co_await job.spawnAsync<probe::Probe>("probe.Probe",
                                          troupe::Placement::group("dnn_group").gpus(64),
                                          labelled("g64").waitForCapacity(5 * kj::SECONDS));
    say("G64 PLACED");
  } catch (const kj::Exception& e) {
    say("G64 FAILED after " + std::to_string((job.timer().now() - started) / kj::MILLISECONDS) +
        " ms: " + e.getDescription().cStr());
  }
}

// Restarts that wait for capacity (SpawnOptions::waitForCapacity applies to each restart too).
// Three data nodes of 4 vCPUs; each actor here takes 3, so one per node. The node of a restartable
// actor is killed; its restart fits nowhere until an actor on another node is stopped.
troupe::Co<void> restartWait(Job& job) {
  auto three = troupe::Placement::group("data_group").cpus(3);
  auto notices = [](const troupe::Restarted& n) {
    say("RESTARTED #" + std::to_string(n.id) + " incarnation " + std::to_string(n.incarnation));
  };
  auto a = co_await job.spawnAsync<probe::Probe>("probe.Probe", three,
                                                 labelled("a")
                                                     .restarts(2, 60 * kj::SECONDS)
                                                     .waitForCapacity(700 * kj::MILLISECONDS)
                                                     .unlinked());
  auto c = job.spawn<probe::Probe>("probe.Probe", three, labelled("c"));
  auto f = job.spawn<probe::Probe>("probe.Probe", three, labelled("f"));
  auto aDown = job.monitor(a.id(), notices);
  co_await a.pingRequest().send();
  // 1. Capacity never frees: the restart waits 700 ms, then the actor ends with why.
  auto started = job.timer().now();
  a.dieRequest().send().detach([](kj::Exception&&) {});
  auto why = co_await kj::mv(aDown);
  say("A DOWN after " + std::to_string((job.timer().now() - started) / kj::MILLISECONDS) +
      " ms: " + why.describe());
  // 2. Capacity frees up: b's node dies, c is stopped 600 ms later, b restarts in c's place.
  co_await job.stop(f.id());
  auto b = co_await job.spawnAsync<probe::Probe>(
      "probe.Probe", three,
      labelled("b").restarts(2, 60 * kj::SECONDS).waitForCapacity(10 * kj::SECONDS).unlinked());
  auto bDown =
      job.monitor(b.id(), notices).then([](troupe::Exit why) { say("B DOWN " + why.describe()); });
  auto first = co_await b.pingRequest().send();
  say("B ON " + std::string(first.getHost().cStr()));
  started = job.timer().now();
  b.dieRequest().send().detach([](kj::Exception&&) {});
  co_await job.timer().afterDelay(600 * kj::MILLISECONDS);
  auto cHost = co_await c.pingRequest().send();
  say("STOPPING c on " + std::string(cHost.getHost().cStr()));
  co_await job.stop(c.id());
  // The reference rebinds: this call waits while the restart waits, then reaches incarnation 2.
  auto again = co_await b.pingRequest().send();
  say("B PLACED after " + std::to_string((job.timer().now() - started) / kj::MILLISECONDS) +
      " ms on " + again.getHost().cStr() + " incarnation " +
      std::to_string(again.getIncarnation()));
  co_await job.stop(b.id());
  co_await kj::mv(bDown);
}

// The job ends while a restart waits: the wait ends with the job, every process exits.
troupe::Co<void> restartWaitAtEnd(Job& job) {
  auto three = troupe::Placement::group("data_group").cpus(3);
  auto a = co_await job.spawnAsync<probe::Probe>(
      "probe.Probe", three,
      labelled("a").restarts(2, 60 * kj::SECONDS).waitForCapacity(60 * kj::SECONDS).unlinked());
  auto c = job.spawn<probe::Probe>("probe.Probe", three, labelled("c"));
  auto f = job.spawn<probe::Probe>("probe.Probe", three, labelled("f"));
  co_await a.pingRequest().send();
  co_await c.pingRequest().send();
  co_await f.pingRequest().send();
  a.dieRequest().send().detach([](kj::Exception&&) {});
  co_await job.timer().afterDelay(500 * kj::MILLISECONDS);
  say("DRIVER RETURNS while a's restart waits");
}

// Gangs: all or nothing. Two one-GPU members cannot both fit on the one GPU node: neither starts
// (the GPU stays free for the next spawn). A gang that fits starts every member.
troupe::Co<void> gang(Job& job) {
  auto gpu = troupe::Placement::group("dnn_group").cpus(0).gpus(1);
  auto data = troupe::Placement::group("data_group").cpus(1);
  try {
    auto members =
        kj::heapArray<troupe::GangMember>({troupe::GangMember{"probe.Probe", data, labelled("d1")},
                                           troupe::GangMember{"probe.Probe", gpu, labelled("t1")},
                                           troupe::GangMember{"probe.Probe", gpu, labelled("t2")}});
    job.spawnGang(members);
    say("GANG1 PLACED");
  } catch (const kj::Exception& e) {
    say(std::string("GANG1 FAILED ") + e.getDescription().cStr());
  }
  say("NAMES LEFT " + std::to_string(job.lookup("d1") != nullptr) +
      std::to_string(job.lookup("t1") != nullptr));
  auto members =
      kj::heapArray<troupe::GangMember>({troupe::GangMember{"probe.Probe", data, labelled("d2")},
                                         troupe::GangMember{"probe.Probe", gpu, labelled("t3")}});
  auto g = job.spawnGang(members);
  auto a = co_await g.get<probe::Probe>(0).pingRequest().send();
  auto b = co_await g.get<probe::Probe>(1).pingRequest().send();
  say(std::string("GANG2 PLACED ") + std::to_string(g.size()) + " on " + a.getGroup().cStr() +
      " and " + b.getGroup().cStr());
}

// A consumer on the head's group does ~300 us of work inline per message while 8 producers on
// the data group stream to it: the head's event loop is never idle (issue 19's busy head). Every
// message is counted at both ends. Arguments after the scenario: --messages N (per producer),
// --bytes B, --spin-us S.
troupe::Co<void> busyHead(Job& job) {
  uint32_t messages = 400, bytes = 64 << 10, spin = 300;
  auto& args = job.args();
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--messages") messages = std::stoul(args[i + 1]);
    if (args[i] == "--bytes") bytes = std::stoul(args[i + 1]);
    if (args[i] == "--spin-us") spin = std::stoul(args[i + 1]);
  }
  auto consumer = job.spawn<probe::Probe>(
      "probe.Probe", troupe::Placement::group("dnn_group").cpus(0), labelled("consumer"));
  auto producers = kj::heapArrayBuilder<troupe::Ref<probe::Probe>>(8);
  for (int i = 0; i < 8; ++i) {
    producers.add(job.spawn<probe::Probe>("probe.Probe",
                                          troupe::Placement::group("data_group").cpus(0),
                                          labelled("producer" + std::to_string(i + 1))));
  }
  auto refs = producers.finish();
  say("FEEDING " + std::to_string(8 * uint64_t(messages)) + " messages");
  auto feeds = kj::heapArrayBuilder<kj::Promise<std::pair<uint64_t, uint64_t>>>(refs.size());
  for (auto& producer : refs) {
    auto req = producer.feedRequest();
    req.setConsumer("consumer");
    req.setCount(messages);
    req.setBytes(bytes);
    req.setSpinUs(spin);
    req.setWindow(4);
    feeds.add(req.send().then([](auto r) { return std::make_pair(r.getSent(), r.getBytes()); }));
  }
  auto done = co_await kj::joinPromises(feeds.finish());
  uint64_t sent = 0, total = 0;
  for (auto& [s, b] : done) {
    sent += s;
    total += b;
  }
  say("FED " + std::to_string(sent) + " messages, " + std::to_string(total) + " bytes");
  (void)consumer;
}

// One actor on the head and one on a data node each hold their node's event loop for 8 s in one
// method body: past the node timeout (3 s) and the head timeout (5 s). The control threads keep
// the heartbeats going; each node names the actor and the method. Then it waits --linger-s (for
// `troupe status`) and ends.
troupe::Co<void> stall(Job& job) {
  uint32_t lingerS = 0, holdMs = 8000;
  auto& args = job.args();
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--linger-s") lingerS = std::stoul(args[i + 1]);
    if (args[i] == "--hold-ms") holdMs = std::stoul(args[i + 1]);
  }
  auto head = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("dnn_group").cpus(0),
                                      labelled("holder-head"));
  auto data = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("data_group").cpus(0),
                                      labelled("holder-data"));
  co_await head.pingRequest().send();
  co_await data.pingRequest().send();
  say("READY");
  auto a = head.workRequest();
  a.setSpinUs(holdMs * 1000);
  auto b = data.workRequest();
  b.setSpinUs(holdMs * 1000);
  auto calls = kj::heapArrayBuilder<kj::Promise<void>>(2);
  calls.add(a.send().ignoreResult());
  calls.add(b.send().ignoreResult());
  co_await kj::joinPromises(calls.finish());
  say("HELD");
  co_await job.timer().afterDelay(lingerS * kj::SECONDS);
  say("DONE");
}

// An actor on a data node makes `--rounds` system calls of `--mb` MiB each that stay in the kernel
// a long time (Probe.populate), a second apart: under a CPU quota the cgroup repays that time with
// every thread stopped, and the node's control thread says so when it stalls.
troupe::Co<void> kernelTime(Job& job) {
  uint32_t mb = 3072, rounds = 3;
  auto& args = job.args();
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--mb") mb = std::stoul(args[i + 1]);
    if (args[i] == "--rounds") rounds = std::stoul(args[i + 1]);
  }
  auto data = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("data_group").cpus(0),
                                      labelled("kernel-time"));
  co_await data.pingRequest().send();
  for (uint32_t i = 0; i < rounds; ++i) {
    auto req = data.populateRequest();
    req.setMb(mb);
    auto r = co_await req.send();
    say("POPULATED " + std::to_string(mb) + " MiB in " + std::to_string(r.getMs()) + " ms");
    co_await job.timer().afterDelay(1 * kj::SECONDS);
  }
  say("DONE");
}

// An actor's address used by another actor before the actor is hosted: a spawn hands the address
// out at once, and here the head's host() call to node X is held up behind 48 MiB on the head's
// connection to X (X's loop held meanwhile), while B on node Y looks the actor up by name and
// calls it over Y's own connection to X, which arrives first. X waits for the host() it has not
// seen yet and answers; before, it said the actor "is not hosted" and the call failed.
troupe::Co<void> earlyResolve(Job& job) {
  auto data = troupe::Placement::group("data_group").cpus(0);
  auto holder = job.spawn<probe::Probe>("probe.Probe", data, labelled("holder"));
  auto x = holder.address().host;
  auto caller = job.spawn<probe::Probe>(
      "probe.Probe", troupe::Placement::group("data_group").cpus(0).labels("host!=" + x),
      labelled("caller"));
  co_await holder.pingRequest().send();
  co_await caller.pingRequest().send();
  auto hold = holder.workRequest();
  hold.setSpinUs(1500 * 1000);
  auto held = hold.send().ignoreResult();
  co_await job.timer().afterDelay(300 * kj::MILLISECONDS);
  auto bulk = holder.echoRequest();
  bulk.setPayload(kj::heapArray<kj::byte>(48u << 20));
  auto echoed = bulk.send().ignoreResult();
  auto late = job.spawn<probe::Probe>(
      "probe.Probe", troupe::Placement::any().labels("host=" + x).cpus(0), labelled("late"));
  auto feed = caller.feedRequest();
  feed.setConsumer("late");
  feed.setCount(1);
  feed.setBytes(16);
  feed.setWindow(1);
  try {
    auto r = co_await feed.send();
    say("EARLY-RESOLVE: " + std::to_string(r.getSent()) + " call answered");
  } catch (const kj::Exception& e) {
    say(std::string("EARLY-RESOLVE: failed: ") + e.getDescription().cStr());
  }
  co_await kj::mv(held);
  co_await kj::mv(echoed);
  co_await late.pingRequest().send();
  say("DONE");
}

// Two calls that fail for a reason the app caused, each printed as the caller sees it: one
// through a reference made for another interface than the actor serves, one to an actor whose
// node the test kills (the test sends SIGKILL on "ERRORS-READY <host>").
kj::Promise<void> errors(Job& job) {
  auto data = troupe::Placement::group("data_group").cpus(0);
  auto wrong = kj::heap(job.spawn<probe::Other>("probe.Probe", data, labelled("wrong").unlinked()));
  auto target =
      kj::heap(job.spawn<probe::Probe>("probe.Probe", data, labelled("target").unlinked()));
  auto& w = *wrong;
  auto& t = *target;
  return w.nothingRequest()
      .send()
      .then([](auto) { say("WRONG-INTERFACE: no error"); },
            [](kj::Exception&& e) {
              say(std::string("WRONG-INTERFACE: ") + e.getDescription().cStr());
            })
      .then([&t]() {
        say("ERRORS-READY " + t.address().host);
        auto req = t.holdRequest();
        req.setMs(60000);
        return req.send().then(
            [](auto) { say("LOST-CALL: no error"); },
            [](kj::Exception&& e) { say(std::string("LOST-CALL: ") + e.getDescription().cStr()); });
      })
      .attach(kj::mv(wrong), kj::mv(target));
}

// An app's own stdout beside troupe's log lines, as most apps write it: printf without fflush.
// Under troupe sim stdout is a pipe; the lines must come in the order they were written.
kj::Promise<void> printing(Job& job) {
  printf("PRINTED one\n");
  return job.timer().afterDelay(300 * kj::MILLISECONDS).then([&job]() {
    spdlog::info("LOGGED two");
    return job.timer().afterDelay(300 * kj::MILLISECONDS).then([]() { printf("PRINTED three\n"); });
  });
}

}  // namespace

Scenario runtimeScenario(const std::string& name) {
  if (name == "fail-anywhere")
    return [](Job& job) -> kj::Promise<void> { return failAnywhere(job); };
  if (name == "unregistered") return unregistered;
  if (name == "prefer-unknown") return preferUnknown;
  if (name == "unplaceable") return unplaceable;
  if (name == "mailbox") return [](Job& job) -> kj::Promise<void> { return mailbox(job); };
  if (name == "concurrency") return [](Job& job) -> kj::Promise<void> { return concurrency(job); };
  if (name == "restart-notices")
    return [](Job& job) -> kj::Promise<void> { return restartNotices(job); };
  if (name == "fail-call-only")
    return [](Job& job) -> kj::Promise<void> { return failCallOnly(job); };
  if (name == "capacity-wait")
    return [](Job& job) -> kj::Promise<void> { return capacityWait(job); };
  if (name == "restart-wait") return [](Job& job) -> kj::Promise<void> { return restartWait(job); };
  if (name == "restart-wait-at-end")
    return [](Job& job) -> kj::Promise<void> { return restartWaitAtEnd(job); };
  if (name == "busy-head") return [](Job& job) -> kj::Promise<void> { return busyHead(job); };
  if (name == "stall") return [](Job& job) -> kj::Promise<void> { return stall(job); };
  if (name == "kernel-time") return [](Job& job) -> kj::Promise<void> { return kernelTime(job); };
  if (name == "early-resolve")
    return [](Job& job) -> kj::Promise<void> { return earlyResolve(job); };
  if (name == "gang") return [](Job& job) -> kj::Promise<void> { return gang(job); };
  if (name == "deadlines") return [](Job& job) -> kj::Promise<void> { return deadlines(job); };
  if (name == "stop-timeout") return [](Job& job) -> kj::Promise<void> { return stopTimeout(job); };
  if (name == "end-slowly") return [](Job& job) -> kj::Promise<void> { return endSlowly(job); };
  if (name == "log-flood") return [](Job& job) -> kj::Promise<void> { return logFlood(job); };
  if (name == "errors") return [](Job& job) -> kj::Promise<void> { return errors(job); };
  if (name == "printing") return [](Job& job) -> kj::Promise<void> { return printing(job); };
  return nullptr;
}

}  // namespace probe_app
