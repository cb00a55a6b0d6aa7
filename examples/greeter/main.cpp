// greeter: the app docs/guide.md builds, outside troupe's tree. One Greeter per node answers
// with where it runs; the driver prints the answers and returns, and the job ends with exit 0.
//
//   troupe sim -- build/greeter [NAME]

#include <cstdio>
#include <string>

#include "greeter.capnp.h"
#include "troupe/troupe.h"

class Greeter final : public troupe::ActorBase<greeter::Greeter> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> greet(GreetContext call) override {
    auto r = call.getResults();
    r.setText(kj::str("hello, ", call.getParams().getName()));
    r.setHost(node().host());
    r.setGroup(node().group());
    return kj::READY_NOW;
  }
};

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<Greeter>();  // registered as "greeter.Greeter", the name of its interface
  return troupe::run(argc, argv, types, [](troupe::Driver& job) -> troupe::Co<void> {
    std::string name = job.args().empty() ? "world" : job.args()[0];
    auto greeters = job.spawnEach<greeter::Greeter>();  // one on every node
    auto replies = KJ_MAP(g, greeters) {
      auto req = g.greetRequest();
      req.setName(name);
      return req.send();
    };
    for (auto& reply : replies) {
      auto r = co_await kj::mv(reply);
      printf("greeter: %s from %s (%s)\n", r.getText().cStr(), r.getHost().cStr(),
             r.getGroup().cStr());
    }
    printf("greeter: %zu %s actors answered\n", replies.size(),
           troupe::actorTypeName<greeter::Greeter>().c_str());
    fflush(stdout);
  });
}
