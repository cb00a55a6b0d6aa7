// hello: every instance of the cluster reports its host, instance group, instance type and vCPUs.
// The driver (on the head) spawns one Greeter per node, prints the table, and returns; the job
// then ends by cascade and every process exits 0.

#include <unistd.h>

#include <cstdio>

#include "hello.capnp.h"
#include "troupe/troupe.h"

class Greeter final : public troupe::ActorBase<hello::Greeter> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> greet(GreetContext call) override {
    const auto& me = node();
    auto r = call.getResults();
    r.setHost(me.host());
    r.setGroup(me.group());
    r.setInstanceType(me.instanceType());
    r.setVcpus(me.vcpus());
    r.setPid(getpid());
    return kj::READY_NOW;
  }
};

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<Greeter>();  // as "hello.Greeter", its interface's name
  return troupe::run(argc, argv, types, [](troupe::Driver& job) -> troupe::Co<void> {
    auto greeters = job.spawnEach<hello::Greeter>();
    // Send every greeting first, then take the replies in order: the calls run concurrently.
    auto replies = KJ_MAP(g, greeters) {
      return g.greetRequest().send();
    };
    printf("%-10s %-12s %-16s %5s %8s\n", "host", "group", "instance type", "vcpus", "pid");
    for (auto& reply : replies) {
      auto r = co_await kj::mv(reply);
      printf("%-10s %-12s %-16s %5u %8u\n", r.getHost().cStr(), r.getGroup().cStr(),
             r.getInstanceType().cStr(), r.getVcpus(), r.getPid());
    }
    printf("hello from %zu instances\n", replies.size());
    fflush(stdout);
  });
}
