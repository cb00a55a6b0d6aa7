// File: troupe/driver.h
//
// The driver: the function an app passes to troupe::run(). It runs on the head once every
// expected node has joined, spawns actors with placements, calls them, and ends the job by
// resolving its promise. Actors it spawns are the roots of the actor tree; when the promise
// resolves (or fails), the head stops them (the cascade) and then tells every node to exit with
// the job's status.

#pragma once

#include <kj/async.h>
#include <kj/function.h>

#include <string>
#include <vector>

#include "troupe/actor.h"
#include "troupe/type_name.h"

namespace troupe {

class Head;

struct JobEnd {
  // How the job ended (Driver::onJobEnd): its exit code (troupe/exit_codes.h: OK, JOB_FAILED,
  // INTERRUPTED, ...), which every node exits with, and the one line the head logged for it.
  int code = 0;
  std::string reason;
};

struct GangMember {
  // One actor of a gang (Driver::spawnGang): a single-instance placement.
  std::string typeName;
  Placement placement;
  SpawnOptions options = {};

  // The same, with the type named by its interface: GangMember::of<hello::Greeter>(placement).
  template <typename T>
  static GangMember of(Placement placement, SpawnOptions options = {}) {
    return GangMember{actorTypeName<T>(), kj::mv(placement), kj::mv(options)};
  }
};

class Gang {
  // The actors of a gang, in the order they were asked for.
 public:
  Gang(kj::Array<ActorContext::Spawned> members, kj::Timer& timer)
      : members_(kj::mv(members)), timer_(&timer) {}
  size_t size() const { return members_.size(); }
  template <typename T>
  Ref<T> get(size_t i) {
    KJ_REQUIRE(i < members_.size(), "no such gang member", i, members_.size());
    return Ref<T>(members_[i].client.template castAs<T>(), members_[i].address, timer_);
  }

 private:
  kj::Array<ActorContext::Spawned> members_;
  kj::Timer* timer_;
};

class Driver {
 public:
  explicit Driver(Head& head, std::vector<std::string> args);

  template <typename T>
  Ref<T> spawn(kj::StringPtr typeName, Placement placement, SpawnOptions options = {}) {
    // Starts one actor. The placement is decided now: an impossible one throws with the reason
    // ("no node in group 'dnn_group' has 1 free gpu: ..."). Calls on the returned ref queue until
    // the actor has started.
    auto spawned = spawnRaw(typeName, placement, kj::mv(options), false);
    return Ref<T>(spawned[0].client.template castAs<T>(), kj::mv(spawned[0].address), &timer());
  }

  template <typename T>
  kj::Array<Ref<T>> spawnMany(kj::StringPtr typeName, Placement placement,
                              SpawnOptions options = {}) {
    // Starts every instance of a multi-instance placement (perVcpu, perNode, onePerNode).
    auto spawned = spawnRaw(typeName, placement, kj::mv(options), true);
    return KJ_MAP(s, spawned) {
      return Ref<T>(s.client.template castAs<T>(), kj::mv(s.address), &timer());
    };
  }

  template <typename T>
  kj::Promise<Ref<T>> spawnAsync(kj::StringPtr typeName, Placement placement,
                                 SpawnOptions options = {}) {
    // spawn() that honours SpawnOptions::waitForCapacity: when the placement does not fit now it
    // waits for capacity (up to that long) instead of throwing; past it, fails with the reason.
    // Without waitForCapacity it decides at once, as spawn() does.
    return spawnRawAsync(typeName, placement, kj::mv(options), false).then([this](auto spawned) {
      return Ref<T>(spawned[0].client.template castAs<T>(), kj::mv(spawned[0].address), &timer());
    });
  }
  template <typename T>
  kj::Promise<kj::Array<Ref<T>>> spawnManyAsync(kj::StringPtr typeName, Placement placement,
                                                SpawnOptions options = {}) {
    return spawnRawAsync(typeName, placement, kj::mv(options), true).then([this](auto spawned) {
      return KJ_MAP(s, spawned) {
        return Ref<T>(s.client.template castAs<T>(), kj::mv(s.address), &timer());
      };
    });
  }

  Gang spawnGang(kj::ArrayPtr<GangMember> members);
  // All-or-nothing: places every member together (each decided after the capacity the earlier
  // ones take, so a spread gang really spreads) and starts them all, or starts none and throws
  // with the reason and the member that did not fit. Get the references with gang.get<T>(i).

  template <typename T>
  kj::Array<Ref<T>> spawnEach(kj::StringPtr typeName, Placement placement = Placement::any(),
                              SpawnOptions options = {}) {
    // One actor on every node: spawnMany with the placement made one-per-node.
    return spawnMany<T>(typeName, placement.perNode(1), kj::mv(options));
  }

  // The same, with the type named by its interface (troupe/type_name.h): spawn<hello::Greeter>
  // starts the type registered with add<Greeter>(), whose interface is hello::Greeter.
  template <typename T>
  Ref<T> spawn(Placement placement, SpawnOptions options = {}) {
    return spawn<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }
  template <typename T>
  kj::Array<Ref<T>> spawnMany(Placement placement, SpawnOptions options = {}) {
    return spawnMany<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }
  template <typename T>
  kj::Array<Ref<T>> spawnEach(Placement placement = Placement::any(), SpawnOptions options = {}) {
    return spawnEach<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }
  template <typename T>
  kj::Promise<Ref<T>> spawnAsync(Placement placement, SpawnOptions options = {}) {
    return spawnAsync<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }
  template <typename T>
  kj::Promise<kj::Array<Ref<T>>> spawnManyAsync(Placement placement, SpawnOptions options = {}) {
    return spawnManyAsync<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }

  template <typename T>
  typename T::Client resolve(const ActorAddress& address) {
    return resolveRaw(address).template castAs<T>();
  }

  kj::Promise<void> stop(uint64_t actorId);
  // Stops an actor and its children (the cascade); resolves when they are gone.
  kj::Promise<Exit> monitor(uint64_t actorId);
  // Resolves once with the reason when the actor exits for good, also if it already has.
  kj::Promise<Exit> monitor(uint64_t actorId, kj::Function<void(const Restarted&)> onRestart);
  // The same, calling `onRestart` for each restart of it before then, in order.
  kj::Maybe<ActorAddress> lookup(kj::StringPtr name);
  kj::Maybe<ActorAddress> current(uint64_t actorId);

  const std::vector<std::string>& args() const { return args_; }
  // The app's own command-line arguments (those troupe did not consume).
  const NodeInfo& node() const;
  const SageMakerEnv& sagemaker() const;
  // This process's SageMaker environment (troupe/sagemaker.h), as troupe::run() loaded it:
  // hyperparameters, channels, the model and output folders; inactive() off SageMaker.
  std::vector<NodeInfo> nodes() const;
  // Every node in the cluster, sorted by host.
  void onNodeJoined(kj::Function<void(const NodeInfo&)> callback);
  // Called on the head's event loop for every node that joins once the driver runs: a host that
  // came up late (--start-with), a new member of a group, or a process started again in place
  // of a lost one (its NodeInfo::incarnation() is then above 0). Place work there with
  // Placement::labels("host=" + host). Akka's MemberUp, for an app that grows with its cluster.
  std::vector<std::string> membershipChanges() const;
  // What changed since the driver started, one line each: "algo-3 (data_group) joined the
  // running job ...", "... rejoined (incarnation 1)", "... left (SIGTERM ...): drained",
  // "... was lost: ...".  The head logs the same at the job's end.
  void onJobEnd(kj::Function<void(const JobEnd& end)> callback);
  // Called once on the head's event loop as the job ends, on every end the head's process lives
  // through (the driver finished or failed, a stop, an actor's or a node's failure): after the
  // cascade (the actors have stopped; what they write as they stop, a checkpoint, is written),
  // before the other nodes are told to exit. The driver's own promise is gone by then (resolved
  // or cancelled), and with it what it owned: the callback keeps what it needs itself. What it
  // throws is logged and changes nothing. Erlang's terminate/2 for a whole job: a report of what
  // was done, whatever ended it.
  EventLoop& loop();
  kj::Timer& timer() { return loop().timer(); }

 private:
  kj::Array<ActorContext::Spawned> spawnRaw(kj::StringPtr typeName, const Placement& placement,
                                            SpawnOptions options, bool many);
  kj::Promise<kj::Array<ActorContext::Spawned>> spawnRawAsync(kj::StringPtr typeName,
                                                              const Placement& placement,
                                                              SpawnOptions options, bool many);
  proto::Actor::Client resolveRaw(const ActorAddress& address);

  Head& head_;
  std::vector<std::string> args_;
};

using DriverFunction = kj::Function<kj::Promise<void>(Driver& job)>;

}  // namespace troupe
