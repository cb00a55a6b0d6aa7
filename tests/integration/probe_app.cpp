// The app behind the integration tests: `probe_app --scenario NAME`. Each scenario exercises one
// part of the lifecycle across real processes and prints lines the tests look for.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include <spdlog/spdlog.h>

#include "probe.capnp.h"
#include "troupe/troupe.h"

namespace {

void say(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
}

class Probe final : public troupe::ActorBase<probe::Probe> {
 public:
  explicit Probe(troupe::ActorContext& context) : ActorBase(context) {
    auto args = context.args<probe::ProbeArgs>();
    label_ = args.getLabel();
    hangOnStop_ = args.getHangOnStop();
  }

  kj::Promise<void> ping(PingContext call) override {
    auto r = call.getResults();
    r.setHost(node().host());
    r.setGroup(node().group());
    r.setIncarnation(self().incarnation);
    r.setPid(getpid());
    return kj::READY_NOW;
  }
  kj::Promise<void> crash(CrashContext call) override {
    context().fail(call.getParams().getWhy());
    return kj::READY_NOW;
  }
  kj::Promise<void> finish(FinishContext) override {
    context().exit(troupe::Exit::normal("done"));
    return kj::READY_NOW;
  }
  kj::Promise<void> spawnChildren(SpawnChildrenContext call) override {
    auto count = call.getParams().getCount();
    auto promises = kj::heapArrayBuilder<kj::Promise<troupe::Ref<probe::Probe>>>(count);
    for (uint32_t i = 0; i < count; ++i) {
      auto label = label_ + "." + std::to_string(i + 1);
      promises.add(context().spawn<probe::Probe>(
          "probe.Probe", troupe::Placement::any().cpus(0),
          troupe::SpawnOptions().args<probe::ProbeArgs>([&](auto a) { a.setLabel(label); })));
    }
    return kj::joinPromises(promises.finish()).then([call](auto refs) mutable {
      auto ids = call.getResults().initIds(refs.size());
      for (size_t i = 0; i < refs.size(); ++i) ids.set(i, refs[i].id());
    });
  }
  kj::Promise<void> echo(EchoContext call) override {
    call.getResults().setPayload(call.getParams().getPayload());
    return kj::READY_NOW;
  }
  kj::Promise<void> failWhen(FailWhenContext call) override {
    std::string why = call.getParams().getWhy();
    switch (call.getParams().getWhen()) {
      case probe::FailPoint::BEFORE_SUSPENDING:
        context().fail(why);
        call.getResults().setValue(42);
        return kj::READY_NOW;
      case probe::FailPoint::AFTER_CO_AWAIT:
        return failAfterCoAwait(call, why);
      case probe::FailPoint::IN_CONTINUATION:
        return context()
            .timer()
            .afterDelay(10 * kj::MILLISECONDS)
            .then([this, call, why]() mutable {
              context().fail(why);
              call.getResults().setValue(42);
            });
      case probe::FailPoint::ON_POOL_RETURN:
        return context()
            .offload([]() {
              usleep(20000);
              return 42u;
            })
            .then([this, call, why](uint32_t v) mutable {
              context().fail(why);
              call.getResults().setValue(v);
            });
    }
    KJ_UNREACHABLE;
  }
  kj::Promise<void> hold(HoldContext call) override { return holdCo(call); }
  kj::Promise<void> depth(DepthContext call) override {
    call.getResults().setDepth(mailboxDepth());
    call.getResults().setRunning(mailboxRunning());
    return kj::READY_NOW;
  }
  kj::Promise<void> die(DieContext) override {
    raise(SIGKILL);
    return kj::READY_NOW;
  }
  kj::Promise<void> work(WorkContext call) override {
    auto until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(call.getParams().getSpinUs());
    while (std::chrono::steady_clock::now() < until) {
    }
    call.getResults().setBytes(call.getParams().getPayload().size());
    return kj::READY_NOW;
  }
  kj::Promise<void> feed(FeedContext call) override { return feedCo(call); }
  kj::Promise<void> throwNow(ThrowNowContext call) override {
    kj::throwFatalException(
        KJ_EXCEPTION(FAILED, kj::str("thrown on purpose: ", call.getParams().getWhy())));
  }
  kj::Promise<void> onStop() override {
    say("STOPPED " + label_);
    if (hangOnStop_) return kj::NEVER_DONE;
    return kj::READY_NOW;
  }

 private:
  troupe::Co<void> failAfterCoAwait(FailWhenContext call, std::string why) {
    co_await context().timer().afterDelay(10 * kj::MILLISECONDS);
    context().fail(why);
    call.getResults().setValue(42);
  }

  troupe::Co<void> feedCo(FeedContext call) {
    auto p = call.getParams();
    uint32_t count = p.getCount(), window = std::max(1u, p.getWindow()), spin = p.getSpinUs();
    auto address = co_await context().lookup(p.getConsumer());
    auto target = context().resolve<probe::Probe>(address);
    auto payload = kj::heapArray<kj::byte>(p.getBytes());
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = kj::byte(i * 7);
    uint64_t sent = 0, bytes = 0;
    for (uint32_t issued = 0; issued < count;) {
      uint32_t n = std::min(window, count - issued);
      auto calls = kj::heapArrayBuilder<kj::Promise<uint64_t>>(n);
      for (uint32_t i = 0; i < n; ++i) {
        auto req = target.workRequest();
        req.setPayload(payload);
        req.setSpinUs(spin);
        calls.add(req.send().then([](auto r) { return r.getBytes(); }));
      }
      auto answered = co_await kj::joinPromises(calls.finish());
      for (auto b : answered) {
        bytes += b;
        ++sent;
      }
      issued += n;
    }
    call.getResults().setSent(sent);
    call.getResults().setBytes(bytes);
  }

  troupe::Co<void> holdCo(HoldContext call) {
    std::string tag = call.getParams().getTag();
    auto ms = call.getParams().getMs();
    ++inHold_;
    uint32_t peak = inHold_;
    peakOf_[tag] = peak;
    for (auto& [t, p] : peakOf_) p = std::max(p, inHold_);
    log_ += (log_.empty() ? "+" : " +") + tag;
    co_await context().timer().afterDelay(ms * kj::MILLISECONDS);
    --inHold_;
    log_ += " -" + tag;
    call.getResults().setPeak(peakOf_[tag]);
    call.getResults().setLog(log_);
    peakOf_.erase(tag);
  }

  std::string label_;
  bool hangOnStop_ = false;
  uint32_t inHold_ = 0;
  std::map<std::string, uint32_t> peakOf_;  // running hold() calls: the most at once seen
  std::string log_;
};

troupe::SpawnOptions labelled(const std::string& label, bool hang = false) {
  return troupe::SpawnOptions().named(label).args<probe::ProbeArgs>([&](auto a) {
    a.setLabel(label);
    a.setHangOnStop(hang);
  });
}

// Asks `p` to fail. The crash call itself fails (DISCONNECTED, with the reason): the actor failed
// during it (docs/lifecycle.md).
kj::Promise<void> crash(probe::Probe::Client p, std::string why) {
  auto req = p.crashRequest();
  req.setWhy(why);
  return req.send().then([why](auto&&) { KJ_FAIL_ASSERT("the crash call returned normally", why); },
                         [](kj::Exception&& e) {
                           KJ_ASSERT(e.getType() == kj::Exception::Type::DISCONNECTED,
                                     e.getDescription());
                         });
}

using Job = troupe::Driver;
using Scenario = kj::Promise<void> (*)(Job&);

kj::Promise<void> pingAll(kj::ArrayPtr<troupe::Ref<probe::Probe>> probes) {
  auto replies = KJ_MAP(p, probes)->kj::Promise<void> {
    return p.pingRequest().send().then(
        [](auto r) { say(std::string("PING ") + r.getHost().cStr() + " " + r.getGroup().cStr()); });
  };
  return kj::joinPromises(kj::mv(replies));
}

// Every node answers; the job ends; everything exits 0.
kj::Promise<void> normal(Job& job) {
  auto probes =
      job.spawnEach<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("p"));
  return pingAll(probes).attach(kj::mv(probes));
}

// Pings every node forever: the tests kill things while it runs.
kj::Promise<void> pingForever(Job& job, kj::Array<troupe::Ref<probe::Probe>>& probes) {
  return job.timer().afterDelay(100 * kj::MILLISECONDS).then([&job, &probes]() {
    auto replies = KJ_MAP(p, probes)->kj::Promise<void> {
      return p.pingRequest().send().ignoreResult();
    };
    return kj::joinPromises(kj::mv(replies)).then([&job, &probes]() {
      return pingForever(job, probes);
    });
  });
}

kj::Promise<void> hold(Job& job) {
  auto probes = kj::heap(
      job.spawnEach<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("p")));
  auto& ref = *probes;
  return pingAll(ref)
      .then([&job, &ref]() {
        say("READY");
        return pingForever(job, ref);
      })
      .attach(kj::mv(probes));
}

// Pings every node for a few seconds, then ends well: the tests poke the ports meanwhile.
kj::Promise<void> linger(Job& job) {
  auto probes = kj::heap(
      job.spawnEach<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("p")));
  auto& ref = *probes;
  return pingAll(ref)
      .then([&job, &ref]() {
        say("READY");
        return job.timer().timeoutAfter(4 * kj::SECONDS, pingForever(job, ref));
      })
      .catch_([](kj::Exception&& e) {
        if (e.getType() != kj::Exception::Type::OVERLOADED &&
            std::string(e.getDescription().cStr()).find("timed out") == std::string::npos) {
          kj::throwFatalException(kj::mv(e));
        }
        say("LINGERED");
      })
      .attach(kj::mv(probes));
}

// Links: an abnormal exit takes the linked actor down with the same reason; a normal one doesn't.
kj::Promise<void> links(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::prefer("data_group").cpus(0),
                                   labelled("a").unlinked());
  auto b = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("b").unlinked());
  auto c = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("c").unlinked());
  auto d = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("d").unlinked());
  auto linkAB = a.linkRequest();
  linkAB.setOther(b.id());
  auto linkCD = c.linkRequest();
  linkCD.setOther(d.id());
  auto bDown = job.monitor(b.id());
  return kj::joinPromises(kj::arr(linkAB.send().ignoreResult(), linkCD.send().ignoreResult()))
      .then([a, c]() mutable {
        return kj::joinPromises(kj::arr(crash(a, "boom"), c.finishRequest().send().ignoreResult()));
      })
      .then([bDown = kj::mv(bDown)]() mutable { return kj::mv(bDown); })
      .then([&job, d](troupe::Exit reason) mutable {
        say("B DOWN " + reason.describe());
        // c ended normally: d must still answer.
        return job.timer().afterDelay(300 * kj::MILLISECONDS).then([d]() mutable {
          return d.pingRequest().send().then([](auto) { say("D ALIVE"); });
        });
      });
}

// Monitors: one `down` with the reason, also when watching starts after the death.
kj::Promise<void> monitors(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                                   labelled("a").unlinked());
  auto early = job.monitor(a.id());
  return crash(a, "on purpose")
      .then([early = kj::mv(early)]() mutable { return kj::mv(early); })
      .then([&job, id = a.id()](troupe::Exit r) {
        say("EARLY " + r.describe());
        return job.monitor(id);
      })
      .then([&job](troupe::Exit r) {
        say("LATE " + r.describe());
        return job.monitor(999999);
      })
      .then([](troupe::Exit r) { say("NOBODY " + r.describe()); });
}

// Restarts: re-placed by the scheduler, the new incarnation answers; past the limit the exit
// escalates to the driver and the job fails.
kj::Promise<void> crashAndPing(Job& job, uint64_t id, int round) {
  auto address = KJ_ASSERT_NONNULL(job.current(id));
  auto probe = job.resolve<probe::Probe>(address);
  return probe.pingRequest().send().then([&job, id, round, probe](auto r) mutable {
    say("INCARNATION " + std::to_string(r.getIncarnation()) + " on " + r.getHost().cStr());
    return crash(probe, "crash " + std::to_string(round)).then([&job, id, round]() {
      return job.timer().afterDelay(300 * kj::MILLISECONDS).then([&job, id, round]() {
        return crashAndPing(job, id, round + 1);
      });
    });
  });
}

kj::Promise<void> restarts(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::prefer("data_group").cpus(0),
                                   labelled("r").restarts(2, 60 * kj::SECONDS));
  return crashAndPing(job, a.id(), 1);
}

// Following restarts: one reference, kept across two crashes, reaches each new incarnation. The
// first calls after a crash may fail (DISCONNECTED); later ones go to the new incarnation. A third
// crash passes the limit (unlinked, so the job goes on): then calls fail with why it exited.
troupe::Co<void> followRestarts(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::prefer("data_group").cpus(0),
                                   labelled("f").restarts(2, 60 * kj::SECONDS).unlinked());
  for (uint32_t want = 1; want <= 3; ++want) {
    for (;;) {
      bool reached = false;
      try {
        auto ping = a.pingRequest();
        auto r = co_await ping.send();
        reached = r.getIncarnation() == want;
        if (reached)
          say("FOLLOWED incarnation " + std::to_string(want) + " on " + r.getHost().cStr());
      } catch (const kj::Exception& e) {
        say(std::string("CALL FAILED ") +
            (e.getType() == kj::Exception::Type::DISCONNECTED
                 ? "DISCONNECTED"
                 : "other: " + std::string(e.getDescription().cStr())));
      }
      if (reached) break;
      co_await job.timer().afterDelay(50 * kj::MILLISECONDS);
    }
    try {
      auto crash = a.crashRequest();
      crash.setWhy("crash " + std::to_string(want));
      co_await crash.send();
    } catch (const kj::Exception&) {
      // The actor may fail the crash call itself as it exits.
    }
  }
  // Gone for good: once the reference has asked the head, calls say why.
  for (int attempt = 0; attempt < 100; ++attempt) {
    try {
      auto ping = a.pingRequest();
      co_await ping.send();
    } catch (const kj::Exception& e) {
      std::string why = e.getDescription().cStr();
      if (why.find("restart limit reached") != std::string::npos) {
        say("GONE: " + why);
        co_return;
      }
    }
    co_await job.timer().afterDelay(20 * kj::MILLISECONDS);
  }
  KJ_FAIL_REQUIRE("calls to an actor past its restart limit never said why it exited");
}

kj::Promise<void> follow(Job& job) {
  return followRestarts(job);
}

// Following a restart after a node loss: the test kills the node that hosts the actor once it
// says where it is; the same reference then reaches the incarnation on the other data node.
troupe::Co<void> followAcrossNodeLoss(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("data_group").cpus(0),
                                   labelled("n").restarts(2, 60 * kj::SECONDS));
  auto first = co_await a.pingRequest().send();
  say(std::string("HOSTED on ") + first.getHost().cStr());
  int failed = 0;
  for (;;) {
    try {
      auto ping = a.pingRequest();
      auto r = co_await ping.send();
      if (r.getIncarnation() > 1) {
        say("FOLLOWED to incarnation " + std::to_string(r.getIncarnation()) + " on " +
            r.getHost().cStr() + " after " + std::to_string(failed) + " failed calls");
        break;
      }
    } catch (const kj::Exception& e) {
      KJ_REQUIRE(e.getType() == kj::Exception::Type::DISCONNECTED, e);
      ++failed;
    }
    co_await job.timer().afterDelay(20 * kj::MILLISECONDS);
  }
}

kj::Promise<void> followNode(Job& job) {
  return followAcrossNodeLoss(job);
}

// After a restart notice, the next call through a reference kept from before reaches the new
// incarnation, whatever ended the old one: a method that threw, context().fail(), its node lost
// (die: SIGKILL to the instance hosting it). One call each, no retries here: a failure is said.
// fail() comes through another reference to the same actor, so `a` saw no failed call.
troupe::Co<void> followAfterNotice(Job& job) {
  auto a = job.spawn<probe::Probe>("probe.Probe", troupe::Placement::group("data_group").cpus(0),
                                   labelled("t").restarts(3, 60 * kj::SECONDS).unlinked());
  uint32_t restarts = 0;
  auto down = job.monitor(a.id(), [&restarts](const troupe::Restarted& r) {
    say("NOTICE incarnation " + std::to_string(r.incarnation) + " after " + r.reason.describe());
    restarts = r.incarnation - 1;
  });
  for (const char* cause : {"fail", "throw", "node-lost"}) {
    auto before = restarts;
    std::string c = cause;
    try {
      if (c == "throw") {
        auto t = a.throwNowRequest();
        t.setWhy("cause throw");
        co_await t.send();
      } else if (c == "fail") {
        // Through a second reference: `a` itself sees no failed call, only the head can tell it.
        auto other = job.resolve<probe::Probe>(a.address());
        auto f = other.failWhenRequest();
        f.setWhen(probe::FailPoint::BEFORE_SUSPENDING);
        f.setWhy("cause fail");
        co_await f.send();
      } else {
        co_await a.dieRequest().send();
      }
    } catch (const kj::Exception&) {
      // The call that ended the incarnation fails with why; only later calls must reach the next.
    }
    for (int i = 0; i < 500 && restarts == before; ++i) {
      co_await job.timer().afterDelay(10 * kj::MILLISECONDS);
    }
    if (restarts == before) {
      say("NO NOTICE after " + c);
      co_return;
    }
    try {
      auto r = co_await a.pingRequest().send();
      say("NEXT CALL after " + c + " reached incarnation " + std::to_string(r.getIncarnation()));
    } catch (const kj::Exception& e) {
      say("NEXT CALL after " + c + " FAILED: " + e.getDescription().cStr());
    }
  }
}

kj::Promise<void> followNotice(Job& job) {
  return followAfterNotice(job);
}

// The cascade: children stop before their parent, newest first; a child that ignores its stop is
// killed at the deadline.
kj::Promise<void> cascade(Job& job) {
  auto parent =
      job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0), labelled("parent"));
  auto hang =
      job.spawn<probe::Probe>("probe.Probe", troupe::Placement::any().cpus(0),
                              labelled("stubborn", true).stopTimeout(300 * kj::MILLISECONDS));
  auto req = parent.spawnChildrenRequest();
  req.setCount(2);
  return req.send().then([hang](auto r) mutable {
    say("CHILDREN " + std::to_string(r.getIds().size()));
    return hang.pingRequest().send().ignoreResult();
  });
}

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

Scenario find(const std::string& name) {
  if (name == "normal") return normal;
  if (name == "hold") return hold;
  if (name == "linger") return linger;
  if (name == "links") return links;
  if (name == "fail-anywhere")
    return [](Job& job) -> kj::Promise<void> { return failAnywhere(job); };
  if (name == "monitors") return monitors;
  if (name == "restarts") return restarts;
  if (name == "follow") return follow;
  if (name == "follow-node") return followNode;
  if (name == "follow-notice") return followNotice;
  if (name == "cascade") return cascade;
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
  if (name == "gang") return [](Job& job) -> kj::Promise<void> { return gang(job); };
  if (name == "deadlines") return [](Job& job) -> kj::Promise<void> { return deadlines(job); };
  if (name == "stop-timeout") return [](Job& job) -> kj::Promise<void> { return stopTimeout(job); };
  if (name == "end-slowly") return [](Job& job) -> kj::Promise<void> { return endSlowly(job); };
  if (name == "log-flood") return [](Job& job) -> kj::Promise<void> { return logFlood(job); };
  if (name == "errors") return [](Job& job) -> kj::Promise<void> { return errors(job); };
  if (name == "printing") return [](Job& job) -> kj::Promise<void> { return printing(job); };
  return nullptr;
}

}  // namespace

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<Probe>("probe.Probe");
  // A test of the registry's refusal (cluster_test): the same name twice.
  if (getenv("PROBE_REGISTER_TWICE") != nullptr) types.add<Probe>("probe.Probe");
  troupe::RunOptions defaults;
  defaults.headGroup = "dnn_group";
  return troupe::run(
      argc, argv, types,
      [](troupe::Driver& job) -> kj::Promise<void> {
        std::string name = "normal";
        auto& args = job.args();
        for (size_t i = 0; i + 1 < args.size(); ++i) {
          if (args[i] == "--scenario") name = args[i + 1];
        }
        auto scenario = find(name);
        KJ_REQUIRE(scenario != nullptr, "unknown scenario", name);
        return scenario(job);
      },
      defaults);
}
