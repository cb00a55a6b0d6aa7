// The app behind the deploy tests: one actor per node reports what that node read from its
// SageMaker-shaped root; the driver prints it, so a test sees the group every process found.
//
// Hyperparameters it reads (through sagemaker() of the driver and of an actor, on every node):
//   epochs      an integer (default 1): a string that is not one fails the job, naming the key
//   crash_group the probe on the first host of this group fails: the job fails with its reason
//   hold_ms     the driver waits this long before ending (for tests that look at running
//               processes)
//   place       a placement text: the driver spawns `place_count` (default 1) more Reporters with
//               it and prints "PLACED <host>" for each (a placement that cannot be met fails the
//               job with the scheduler's reason)
//   write_outputs  1: every probe writes model/from-<host>.txt and model/shared.txt (its host),
//               and the driver writes output/data/report.json (what `troupe sim` keeps)
//
// The driver first prints a "NODEINFO" line for every node: what the head knows of it.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "probe.capnp.h"
#include "troupe/sagemaker.h"
#include "troupe/troupe.h"

namespace {

void say(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out.empty() ? "-" : out;
}

class Reporter final : public troupe::ActorBase<probe::Probe> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> ping(PingContext call) override {
    auto& sm = sagemaker();
    say(std::string("NODE ") + node().host().cStr() + " group=" + node().group().cStr() +
        " type=" + node().instanceType().cStr() + " sm=" + (sm.active() ? "yes" : "no") +
        " epochs=" + std::to_string(sm.getInt("epochs", 1)) + " layers=" + sm.getJson("layers") +
        " name=" + sm.getString("name", "-") + " channels=" + join(sm.channels()));
    if (sm.getInt("write_outputs", 0) == 1) {
      std::string host = node().host().cStr();
      std::ofstream(sm.modelDir() + "/from-" + host + ".txt") << host << "\n";
      std::ofstream(sm.modelDir() + "/shared.txt") << host << "\n";
    }
    auto r = call.getResults();
    r.setHost(node().host());
    r.setGroup(node().group());
    r.setPid(getpid());
    return kj::READY_NOW;
  }
  kj::Promise<void> crash(CrashContext call) override {
    context().fail(call.getParams().getWhy());
    return kj::READY_NOW;
  }
  kj::Promise<void> finish(FinishContext) override { return kj::READY_NOW; }
  kj::Promise<void> spawnChildren(SpawnChildrenContext) override { return kj::READY_NOW; }
  kj::Promise<void> echo(EchoContext call) override {
    call.getResults().setPayload(call.getParams().getPayload());
    return kj::READY_NOW;
  }
};

std::string describe(const troupe::NodeInfo& n) {
  std::string labels, resources;
  for (auto& [k, v] : n.labels()) labels += (labels.empty() ? "" : ",") + k + "=" + v;
  for (auto& [k, v] : n.resources()) {
    resources += (resources.empty() ? "" : ",") + k + "=" + std::to_string(v);
  }
  return std::string("NODEINFO ") + n.host().cStr() + " vcpus=" + std::to_string(n.vcpus()) +
         " gpus=" + std::to_string(n.gpus()) + " labels=" + (labels.empty() ? "-" : labels) +
         " resources=" + (resources.empty() ? "-" : resources);
}

// The `place` hyperparameter: spawn Reporters with that placement and say where each went.
kj::Promise<void> placeMore(troupe::Driver& job, const std::string& text, int64_t count) {
  kj::Vector<troupe::Ref<probe::Probe>> refs;
  for (int64_t i = 0; i < count; ++i) {
    refs.add(job.spawn<probe::Probe>("sm.Reporter", troupe::Placement::fromText(text)));
  }
  auto replies = KJ_MAP(r, refs) {
    return r.pingRequest().send().then(
        [](auto reply) { say(std::string("PLACED ") + reply.getHost().cStr()); });
  };
  return kj::joinPromises(kj::mv(replies)).attach(kj::mv(refs));
}

kj::Promise<void> job(troupe::Driver& job) {
  auto& sm = job.sagemaker();
  sm.getInt("epochs", 1);  // a bad value fails the job here, naming the key and the value
  for (auto& n : job.nodes()) say(describe(n));
  if (sm.getInt("write_outputs", 0) == 1) {
    std::ofstream(sm.outputDataDir() + "/report.json")
        << "{\"head\": \"" << job.node().host().cStr() << "\"}\n";
  }
  auto probes =
      kj::heap(job.spawnEach<probe::Probe>("sm.Reporter", troupe::Placement::any().cpus(0)));
  auto& ref = *probes;
  auto replies = KJ_MAP(p, ref) {
    return p.pingRequest().send().then([](auto r) {
      say(std::string("PING ") + r.getHost().cStr() + " " + r.getGroup().cStr());
      return std::make_pair(std::string(r.getHost().cStr()), std::string(r.getGroup().cStr()));
    });
  };
  return kj::joinPromises(kj::mv(replies))
      .then([&job, &ref, &sm](kj::Array<std::pair<std::string, std::string>> found) {
        auto crashGroup = sm.getString("crash_group", "");
        if (!crashGroup.empty()) {
          for (size_t i = 0; i < found.size(); ++i) {
            if (found[i].second != crashGroup) continue;
            auto req = ref[i].crashRequest();
            req.setWhy("boom on " + found[i].first);
            return req.send().ignoreResult().then([&job]() {
              return job.timer().afterDelay(10 * kj::SECONDS);  // the failure ends the job first
            });
          }
        }
        auto place = sm.getString("place", "");
        auto placed = place.empty() ? kj::Promise<void>(kj::READY_NOW)
                                    : placeMore(job, place, sm.getInt("place_count", 1));
        return placed.then([&job, &sm]() {
          return job.timer().afterDelay(sm.getInt("hold_ms", 0) * kj::MILLISECONDS);
        });
      })
      .attach(kj::mv(probes));
}

}  // namespace

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<Reporter>("sm.Reporter");
  return troupe::run(argc, argv, types, job);  // the head: the first host of the GPU group
}
