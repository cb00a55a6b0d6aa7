// The app behind the integration tests: `probe_app --scenario NAME`. Each scenario exercises one
// part of the lifecycle across real processes and prints lines the tests look for.
// Its scenarios: probe_app.h.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <spdlog/spdlog.h>

#include "probe.capnp.h"
#include "probe_app.h"
#include "troupe/troupe.h"

namespace probe_app {

void say(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
}

troupe::SpawnOptions labelled(const std::string& label, bool hang) {
  return troupe::SpawnOptions().named(label).args<probe::ProbeArgs>([&](auto a) {
    a.setLabel(label);
    a.setHangOnStop(hang);
  });
}

kj::Promise<void> crash(probe::Probe::Client p, std::string why) {
  auto req = p.crashRequest();
  req.setWhy(why);
  return req.send().then([why](auto&&) { KJ_FAIL_ASSERT("the crash call returned normally", why); },
                         [](kj::Exception&& e) {
                           KJ_ASSERT(e.getType() == kj::Exception::Type::DISCONNECTED,
                                     e.getDescription());
                         });
}


kj::Promise<void> pingAll(kj::ArrayPtr<troupe::Ref<probe::Probe>> probes) {
  auto replies = KJ_MAP(p, probes)->kj::Promise<void> {
    return p.pingRequest().send().then(
        [](auto r) { say(std::string("PING ") + r.getHost().cStr() + " " + r.getGroup().cStr()); });
  };
  return kj::joinPromises(kj::mv(replies));
}

}  // namespace probe_app

using namespace probe_app;

namespace {

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
  kj::Promise<void> populate(PopulateContext call) override {
    auto start = std::chrono::steady_clock::now();
    size_t bytes = size_t(call.getParams().getMb()) << 20;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    KJ_REQUIRE(p != MAP_FAILED, "mmap of the populate call failed", strerror(errno));
    munmap(p, bytes);
    call.getResults().setMs(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count());
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

Scenario find(const std::string& name) {
  auto scenario = lifecycleScenario(name);
  return scenario != nullptr ? scenario : runtimeScenario(name);
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

