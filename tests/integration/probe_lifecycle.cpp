// probe_app's lifecycle scenarios (probe_app.h): links, monitors, restarts, references that follow
// them, the cascade.

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

}  // namespace

Scenario lifecycleScenario(const std::string& name) {
  if (name == "normal") return normal;
  if (name == "hold") return hold;
  if (name == "linger") return linger;
  if (name == "links") return links;
  if (name == "monitors") return monitors;
  if (name == "restarts") return restarts;
  if (name == "follow") return follow;
  if (name == "follow-node") return followNode;
  if (name == "follow-notice") return followNotice;
  if (name == "cascade") return cascade;
  return nullptr;
}

}  // namespace probe_app
