// File: troupe/actor.h
//
// Actors. An actor is a Cap'n Proto server implementing an interface that extends troupe's Actor
// interface; a reference to it is a capability (its Client). Write one by deriving from
// ActorBase<YourInterface> and overriding the interface's methods, which return kj::Promise and
// must never block the event loop (use offload() for CPU work):
//
//   class Greeter final : public troupe::ActorBase<hello::Greeter> {
//    public:
//     using ActorBase::ActorBase;
//     kj::Promise<void> greet(GreetContext call) override {
//       call.getResults().setHost(node().host());
//       return kj::READY_NOW;
//     }
//   };
//
// Mailbox (as Erlang's, and Ray's default max_concurrency=1): an actor serves one call at a time,
// in arrival order; a call that awaits holds the actor until it returns. SpawnOptions().
// maxConcurrency(n) lets n run at once. Methods annotated $Troupe.concurrent, and the Actor
// interface's own methods (stop, link, monitor, info), never wait in the mailbox.
//
// Lifecycle (Erlang/OTP semantics): every actor has a parent (the driver is the root) and by
// default is linked to it, so an abnormal exit escalates to the parent unless the actor's restart
// policy restarts it first. Stopping an actor stops its children first, in reverse start order,
// each with a deadline after which it is killed. Once an actor has exited, calls on it fail with a
// DISCONNECTED kj::Exception naming the actor and the reason; calls in flight fail the same way.
// An exception escaping a method fails the actor (as a crash in an Erlang handler does), subject
// to its restart policy, unless it was spawned with onMethodError(MethodError::FAIL_CALL).

#pragma once

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <kj/async.h>
#include <kj/time.h>

#include <capnp/schema.h>

#include <deque>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "troupe.capnp.h"
#include "troupe/loop.h"
#include "troupe/sagemaker.h"
#include "troupe/trace.h"
#include "troupe/sched/placement.h"
#include "troupe/type_name.h"

namespace troupe {

using sched::Placement;
using ExitKind = proto::ExitReason::Kind;

struct Exit {
  // Why an actor ended. NORMAL and SHUTDOWN are normal; every other kind is abnormal.
  ExitKind kind = ExitKind::NORMAL;
  std::string text;

  bool abnormal() const { return kind != ExitKind::NORMAL && kind != ExitKind::SHUTDOWN; }
  static Exit normal(std::string text = "normal") { return {ExitKind::NORMAL, kj::mv(text)}; }
  static Exit shutdown(std::string text = "shutdown") { return {ExitKind::SHUTDOWN, kj::mv(text)}; }
  static Exit failed(std::string text) { return {ExitKind::FAILED, kj::mv(text)}; }

  static Exit fromProto(proto::ExitReason::Reader r);
  void toProto(proto::ExitReason::Builder b) const;
  std::string describe() const;  // "failed: disk full"
};

struct ActorAddress {
  // Where an actor lives; travels between nodes in place of a capability (proto::ActorAddress).
  uint64_t id = 0;
  uint32_t incarnation = 0;
  uint32_t nodeId = 0;
  std::string host;
  std::string group;
  std::string address;  // "ip:port" of the owning node
  std::string typeName;
  std::string name;
  bool restartable = false;  // has a restart policy; references follow it to new incarnations

  static ActorAddress fromProto(proto::ActorAddress::Reader r);
  void toProto(proto::ActorAddress::Builder b) const;
  std::string describe() const;  // "'trainer' (train.Trainer #3) on algo-2 (dnn_group)"
};

capnp::Capability::Client withDeadline(capnp::Capability::Client target, kj::Duration deadline,
                                       kj::Timer& timer, capnp::InterfaceSchema schema,
                                       ActorAddress address);
// A local capability forwarding every call to `target`, failing (and cancelling) each one that has
// not returned within `deadline` with an OVERLOADED exception naming the actor and the method.

kj::Exception deadlineExceeded(const ActorAddress& actor, kj::StringPtr method,
                               kj::Duration deadline, kj::StringPtr where);
// "call Probe.sleep to 'slow' (probe.Probe #2) on algo-1 (data_group) did not return within
// 200 ms (<where>)", OVERLOADED.

template <typename T>
class Ref : public T::Client {
  // A reference to an actor: its capability (call methods on it directly) plus its address (pass
  // that to other actors, which resolve it on a direct connection to the owning node).
 public:
  Ref(typename T::Client client, ActorAddress address, kj::Timer* timer = nullptr)
      // Generated Client classes inherit Capability::Client virtually: the most derived class
      // must initialise it, or the reference would be null.
      : capnp::Capability::Client(kj::mv(client)),
        T::Client(nullptr),
        address_(kj::mv(address)),
        timer_(timer) {}
  const ActorAddress& address() const { return address_; }
  uint64_t id() const { return address_.id; }

  Ref within(kj::Duration deadline) {
    // The same actor, with a deadline on every call made through the returned reference: a call
    // that has not returned `deadline` after it was sent fails at the caller with OVERLOADED
    // naming the actor and the method. The actor still finishes it (Cap'n Proto 0.9 does not
    // cancel a call its server has not allowed to be cancelled), holding its mailbox until then;
    // the default deadline given at spawn (SpawnOptions::callDeadline), which the actor's node
    // enforces for every caller, does cancel it there. The shorter of the two fails the call.
    //   auto r = co_await trainer.within(2 * kj::SECONDS).progressRequest().send();
    KJ_REQUIRE(timer_ != nullptr,
               "Ref::within() needs a reference made by spawn() (it carries the event loop)",
               address_.describe());
    typename T::Client self = *this;
    auto forwarded =
        withDeadline(kj::mv(self), deadline, *timer_, capnp::Schema::from<T>(), address_);
    return Ref(forwarded.template castAs<T>(), address_, timer_);
  }

 private:
  ActorAddress address_;
  kj::Timer* timer_;
};

enum class MethodError {
  FAIL_ACTOR,  // an exception escaping a method fails the actor (the default, as in Erlang)
  FAIL_CALL,   // it fails only that call; the actor runs on (troupe before mailboxes)
};

class SpawnOptions {
  // How to start an actor besides its placement. Chain the setters:
  //   SpawnOptions().named("trainer").restarts(3, 60 * kj::SECONDS).args<train::Args>(fill)
 public:
  SpawnOptions& named(std::string n) {
    name = kj::mv(n);
    return *this;
  }
  SpawnOptions& unlinked() {
    // Do not link to the parent: an abnormal exit then only reaches monitors.
    link = false;
    return *this;
  }
  SpawnOptions& restarts(uint32_t max, kj::Duration within = 60 * kj::SECONDS) {
    // Restart up to `max` times within `within` after an abnormal exit (including the loss of
    // its node); past that the exit escalates to the parent.
    maxRestarts = max;
    restartWindow = within;
    return *this;
  }
  SpawnOptions& stopTimeout(kj::Duration d) {
    // How long the actor's onStop() may take when it is stopped before it is killed. Without
    // this, the --stop-timeout-ms of the instance that spawns it (5000 by default).
    stopDeadline = d;
    return *this;
  }
  SpawnOptions& maxConcurrency(uint32_t n) {
    // How many of the actor's calls may run at once (Ray's max_concurrency). The default, 1, is
    // Erlang's mailbox: one call at a time, in arrival order. With n > 1 up to n calls run
    // interleaved at their co_awaits; later ones wait, in arrival order.
    KJ_REQUIRE(n >= 1, "maxConcurrency must be at least 1 (1 = one call at a time)", n);
    concurrency = n;
    return *this;
  }
  SpawnOptions& onMethodError(MethodError what) {
    // What an exception escaping one of the actor's methods does: fail the actor (the default;
    // its restart policy then applies) or only that call.
    methodError = what;
    return *this;
  }
  SpawnOptions& waitForCapacity(kj::Duration d) {
    // A spawn that does not fit now (the nodes that could take it are busy, or have not joined
    // yet) waits up to `d` for capacity instead of failing at once: it is retried, in request
    // order, whenever an actor releases resources or a node joins. Past `d` it fails OVERLOADED
    // with the reason it did not fit. One that could never fit (no node has that much in total)
    // fails at once. Honoured by context().spawn*() and job.spawnAsync()/spawnManyAsync().
    KJ_REQUIRE(d > 0 * kj::MILLISECONDS && d / kj::MILLISECONDS <= 0xffffffffll,
               "a capacity wait must be between 1 ms and 2^32 ms", d);
    capacityWait = d;
    return *this;
  }
  SpawnOptions& callDeadline(kj::Duration d) {
    // Every call to the actor must return within `d` of arriving at its node (time waiting in the
    // mailbox included); past it the call is cancelled and fails with OVERLOADED naming the actor
    // and the method. Callers can set a shorter deadline per call with Ref::within().
    KJ_REQUIRE(d > 0 * kj::MILLISECONDS && d / kj::MILLISECONDS <= 0xffffffffll,
               "a call deadline must be between 1 ms and 2^32 ms", d);
    deadline = d;
    return *this;
  }
  SpawnOptions& quiet() {
    // The head logs the actor's start at debug level, not info: for an app that says where its
    // actors run in its own words (troupe.data's DataLoader: one line per data instance).
    // Restarts and exits are logged as ever.
    quietStart = true;
    return *this;
  }
  template <typename S, typename Fill>
  SpawnOptions& args(Fill&& fill) {
    // The actor's arguments: a message of struct type S, filled by `fill(S::Builder)`. The actor
    // reads them with context().args<S>().
    capnp::MallocMessageBuilder message;
    fill(message.initRoot<S>());
    auto words = capnp::messageToFlatArray(message);
    auto bytes = words.asBytes();
    argBytes.assign(bytes.begin(), bytes.end());
    return *this;
  }

  std::string name;
  bool link = true;
  uint32_t maxRestarts = 0;
  kj::Duration restartWindow = 60 * kj::SECONDS;
  kj::Maybe<kj::Duration> stopDeadline;  // none: the spawning instance's --stop-timeout-ms
  uint32_t concurrency = 1;
  MethodError methodError = MethodError::FAIL_ACTOR;
  kj::Maybe<kj::Duration> deadline;
  kj::Maybe<kj::Duration> capacityWait;
  std::vector<kj::byte> argBytes;  // a flat Cap'n Proto message
  bool quietStart = false;
};

struct CallPolicy {
  // How an actor serves calls, from its SpawnOptions (carried in proto::SpawnSpec).
  uint32_t maxConcurrency = 1;
  bool failCallOnly = false;
  kj::Maybe<kj::Duration> deadline;
};

class NodeInfo {
  // This instance: its host, instance group, instance type and size. A value: the node that
  // describes itself builds one when it starts (run(): identity from the cluster description,
  // size from the machine) and the head keeps the copies its workers sent.
 public:
  struct Size {
    // What the node offers the scheduler (troupe/node_size.h says where each part comes from).
    uint32_t vcpus = 1, gpus = 0;
    uint64_t memoryBytes = 0;
    std::map<std::string, std::string> labels;
    std::map<std::string, double> resources;
  };

  NodeInfo() = default;
  NodeInfo(std::string host, std::string group, std::string instanceType, std::string address,
           bool isHead, uint32_t incarnation, Size size)
      : host_(kj::mv(host)),
        group_(kj::mv(group)),
        instanceType_(kj::mv(instanceType)),
        address_(kj::mv(address)),
        size_(kj::mv(size)),
        isHead_(isHead),
        incarnation_(incarnation) {}

  kj::StringPtr host() const { return host_.c_str(); }
  kj::StringPtr group() const { return group_.c_str(); }
  kj::StringPtr instanceType() const { return instanceType_.c_str(); }
  kj::StringPtr address() const { return address_.c_str(); }
  uint32_t vcpus() const { return size_.vcpus; }
  uint32_t gpus() const { return size_.gpus; }
  uint64_t memoryBytes() const { return size_.memoryBytes; }
  // User labels and custom resources (troupe/node_size.h says where they come from).
  const std::map<std::string, std::string>& labels() const { return size_.labels; }
  const std::map<std::string, double>& resources() const { return size_.resources; }
  const Size& size() const { return size_; }
  bool isHead() const { return isHead_; }
  uint32_t incarnation() const { return incarnation_; }
  // Which process of its host this is: 0, then 1, 2, ... when the per-instance entry point
  // started it again (TROUPE_INCARNATION; docs/lifecycle.md, "Membership").

  static NodeInfo fromProto(proto::NodeInfo::Reader r);
  void toProto(proto::NodeInfo::Builder b) const;  // pid: this process's

 private:
  std::string host_, group_, instanceType_, address_;
  Size size_;
  bool isHead_ = false;
  uint32_t incarnation_ = 0;
};

struct Restarted {
  // A monitor's notice that an actor exited abnormally and its restart policy started a new
  // incarnation in its place (Erlang's supervisor reports; monitors see them here).
  uint64_t id = 0;
  uint32_t incarnation = 0;  // the new incarnation (2 after the first restart)
  Exit reason;               // why the previous incarnation ended
};

class ActorHost;  // the node hosting the actor (private to the runtime)

class ActorContext {
  // What an actor can do besides serving calls: spawn children, resolve and monitor other actors,
  // run CPU work on the pool, and exit. One per actor incarnation, owned by the actor.
 public:
  ActorContext(ActorHost& node, ActorAddress self, kj::Array<kj::byte> args, uint32_t index = 0,
               uint32_t count = 1, CallPolicy policy = {});

  const ActorAddress& self() const { return self_; }
  const CallPolicy& callPolicy() const { return policy_; }
  uint32_t instanceIndex() const { return index_; }
  uint32_t instanceCount() const { return count_; }
  // For actors started together by spawnMany()/spawnEach(): this one's position (0-based) and
  // how many were started — e.g. which shard of a dataset to serve. 0 and 1 otherwise; kept
  // across restarts.
  const NodeInfo& node() const;
  const SageMakerEnv& sagemaker() const;
  // This process's SageMaker environment (troupe/sagemaker.h), as troupe::run() loaded it;
  // inactive() off SageMaker.
  EventLoop& loop();
  kj::Timer& timer() { return loop().timer(); }

  template <typename S>
  typename S::Reader args() {
    // The arguments given at spawn (SpawnOptions::args<S>). Valid for the actor's lifetime.
    KJ_REQUIRE(argBytes_.size() >= sizeof(capnp::word), "this actor was spawned without args",
               self_.describe());
    if (argReader_.get() == nullptr) {
      argWords_ = kj::heapArray<capnp::word>(argBytes_.size() / sizeof(capnp::word));
      memcpy(argWords_.begin(), argBytes_.begin(), argWords_.size() * sizeof(capnp::word));
      argReader_ = kj::heap<capnp::FlatArrayMessageReader>(argWords_);
    }
    return argReader_->getRoot<S>();
  }

  template <typename T>
  kj::Promise<Ref<T>> spawn(kj::StringPtr typeName, Placement placement,
                            SpawnOptions options = {}) {
    // Starts a child of this actor. The placement is decided by the head's scheduler.
    return spawnRaw(typeName, placement, kj::mv(options), false).then([this](auto refs) {
      return Ref<T>(refs[0].client.template castAs<T>(), kj::mv(refs[0].address), &timer());
    });
  }
  template <typename T>
  kj::Promise<kj::Array<Ref<T>>> spawnMany(kj::StringPtr typeName, Placement placement,
                                           SpawnOptions options = {}) {
    // Starts one child per instance of a multi-instance placement (onePerNode, perVcpu, ...).
    return spawnRaw(typeName, placement, kj::mv(options), true).then([this](auto refs) {
      return KJ_MAP(r, refs) {
        return Ref<T>(r.client.template castAs<T>(), kj::mv(r.address), &timer());
      };
    });
  }

  // The same, with the type named by its interface (troupe/type_name.h).
  template <typename T>
  kj::Promise<Ref<T>> spawn(Placement placement, SpawnOptions options = {}) {
    return spawn<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }
  template <typename T>
  kj::Promise<kj::Array<Ref<T>>> spawnMany(Placement placement, SpawnOptions options = {}) {
    return spawnMany<T>(actorTypeName<T>(), kj::mv(placement), kj::mv(options));
  }

  template <typename T>
  typename T::Client resolve(const ActorAddress& address) {
    // A capability for the actor at `address`, over a direct connection to its node (cached per
    // peer). Calls queue until the connection is up.
    return resolveRaw(address).template castAs<T>();
  }
  template <typename T>
  typename T::Client resolve(proto::ActorAddress::Reader address) {
    return resolve<T>(ActorAddress::fromProto(address));
  }

  kj::Promise<ActorAddress> lookup(kj::StringPtr name);
  // The current incarnation of a named actor; fails when no actor has that name.
  kj::Promise<ActorAddress> current(uint64_t id);
  // The current incarnation of an actor (after a restart it lives elsewhere).

  kj::Promise<Exit> monitor(uint64_t id);
  // Resolves once with the reason when the actor `id` exits for good, also if it already has.
  kj::Promise<Exit> monitor(uint64_t id, kj::Function<void(const Restarted&)> onRestart);
  // The same, calling `onRestart` for each restart of it before then, in order.
  kj::Promise<void> link(uint64_t id);
  // Links this actor with `id`: an abnormal exit of either ends the other with the same reason.

  template <typename Fn>
  auto offload(Fn&& fn) {
    // Runs CPU-heavy work on the node's compute pool; see EventLoop::offload. The actor is not
    // destroyed while a job it offloaded still runs (the node waits for them after the actor
    // exits), and once it has exited offload() rejects with DISCONNECTED.
    return loop().offload(work_, kj::fwd<Fn>(fn));
  }
  template <typename T, typename Fn>
  auto offloadInto(kj::Own<T> target, Fn&& fn) {
    // The same for work that writes into `target`'s memory (EventLoop::offloadInto): a batch
    // built in place in its request, which a cancelled call cannot free while the job writes.
    return loop().offloadInto(work_, kj::mv(target), kj::fwd<Fn>(fn));
  }
  WorkGroup& work() { return work_; }
  // This actor's offloaded jobs (used by the runtime to wait for them).

  void exit(Exit reason);
  // Ends this actor: its children are stopped, calls fail, monitors are told. An abnormal reason
  // escalates through links (to the parent by default) unless the restart policy restarts it.
  void fail(std::string text) { exit(Exit::failed(kj::mv(text))); }

  ActorHost& host() { return node_; }
  // -- used by the runtime --

  struct Spawned {
    proto::Actor::Client client;
    ActorAddress address;
  };

 private:
  kj::Promise<kj::Array<Spawned>> spawnRaw(kj::StringPtr typeName, const Placement& placement,
                                           SpawnOptions options, bool many);
  proto::Actor::Client resolveRaw(const ActorAddress& address);

  ActorHost& node_;
  ActorAddress self_;
  uint32_t index_, count_;
  CallPolicy policy_;
  kj::Array<kj::byte> argBytes_;
  kj::Array<capnp::word> argWords_;
  kj::Own<capnp::FlatArrayMessageReader> argReader_;
  WorkGroup work_;
};

class ActorCore {
  // The part of every actor that does not depend on its interface. Override onStart() for work
  // that begins when the actor starts (its failure is an abnormal exit) and onStop() for cleanup
  // (bounded by the stop deadline).
 public:
  explicit ActorCore(ActorContext& context);
  virtual ~ActorCore() noexcept(false);
  KJ_DISALLOW_COPY(ActorCore);

  virtual kj::Promise<void> onStart() { return kj::READY_NOW; }
  virtual kj::Promise<void> onStop() { return kj::READY_NOW; }
  virtual bool failsActor(kj::StringPtr method, const kj::Exception& error) const;
  // Whether an exception that escaped `method` ("Augmenter.produce") fails this actor. By
  // default it does (its restart policy then applies), unless the actor was spawned with
  // MethodError::FAIL_CALL or the method is one it does not implement. Override it to keep errors
  // that belong to the caller (a consumer that went away mid-stream) from failing the actor.

  ActorContext& context() { return *context_; }
  const NodeInfo& node() const { return context_->node(); }
  const SageMakerEnv& sagemaker() const { return context_->sagemaker(); }
  const ActorAddress& self() const { return context_->self(); }

  // -- used by the runtime --
  void markExited(const Exit& reason);
  // After this, new calls fail with a DISCONNECTED exception naming the reason, calls in flight
  // fail the same way when they complete, and offload() refuses work. Safe to call from inside
  // one of the actor's own calls (ActorContext::exit() does): nothing is cancelled here.
  void cancelCalls();
  // Cancels the calls still in flight (with the exit reason). Must not run inside one of them:
  // the runtime calls it from a later turn.
  bool exited() const { return exited_ != nullptr; }
  size_t mailboxDepth() const { return depth_; }
  // Calls that arrived through the mailbox and have not returned yet: the one(s) running plus
  // those waiting for their turn ($concurrent methods and the Actor interface's are not counted).
  // The node reports it with its heartbeats (`troupe status`).
  uint32_t mailboxRunning() const { return running_; }
  // Of those, how many run now (at most maxConcurrency).

 protected:
  struct MethodInfo {
    std::string name;  // "Probe.sleep"
    bool concurrent = false;
    bool streaming = false;  // declared `-> stream`
  };
  using MethodTable = std::map<std::pair<uint64_t, uint16_t>, MethodInfo>;
  static MethodTable methodTable(capnp::InterfaceSchema schema);
  // Every method of the interface and the interfaces it extends, with its $concurrent annotation.
  kj::Exception unknownCall(capnp::InterfaceSchema schema, uint64_t interfaceId,
                            uint16_t methodId) const;
  // A call this actor does not serve (a reference cast to another interface, or a caller built
  // from another version of the schema): UNIMPLEMENTED, naming the actor, its node, what it
  // serves and what to do, in place of Cap'n Proto's "Requested interface not implemented".

  class Held {
    // Times a method's body (up to the promise it returns) on the event loop: past
    // --stall-warn-ms its node names the actor and the method (docs/lifecycle.md, "Who holds
    // the loop").
   public:
    Held(ActorCore& core, const MethodInfo& method);
    ~Held();
    KJ_DISALLOW_COPY(Held);

   private:
    ActorCore& core_;
    const MethodInfo& method_;
    int64_t start_;  // steady clock, microseconds
  };

  void checkAlive() const;
  kj::Promise<void> guard(kj::Promise<void> call, const MethodInfo& method);
  // A user method's promise as the caller sees it: cancelled by cancelCalls(), and failing with
  // the exit reason if the actor failed while the method ran (even if the method then returned
  // normally). An exception escaping the method fails the actor unless its policy is FAIL_CALL.
  kj::Promise<void> throughMailbox(kj::Function<kj::Promise<void>()> dispatch);
  // Runs `dispatch` when the mailbox has room (at once if it has), holding a place until the
  // promise it returns completes or is cancelled.
  kj::Promise<void> withDeadline(kj::Promise<void> call, const MethodInfo& method);
  // The call under the actor's default deadline (SpawnOptions::callDeadline), if it has one.

  kj::Promise<void> stopImpl();
  kj::Promise<void> linkImpl(uint64_t other);
  kj::Promise<void> monitorImpl(proto::Watcher::Client watcher);
  void infoImpl(proto::ActorAddress::Builder out) const { self().toProto(out); }
  kj::Promise<void> traceCall(kj::Promise<void> call, capnp::InterfaceSchema schema,
                              uint64_t interfaceId, uint16_t methodId, int64_t start);
  // With --trace: the call as a span on this actor's row, named after the method.

 private:
  class Slot;
  kj::Promise<kj::Own<Slot>> enterMailbox();
  void leaveMailbox();

  ActorContext* context_;  // owned beside the actor: the Registry attaches it to the actor's Own
  // The mailbox, declared before canceler_: cancelling the calls releases their places in it.
  uint32_t running_ = 0;
  size_t depth_ = 0;
  std::deque<kj::Own<kj::PromiseFulfiller<kj::Own<Slot>>>> waiting_;
  kj::Canceler canceler_;
  kj::Maybe<Exit> exited_;
};

namespace detail {
template <typename Interface>
inline constexpr bool kIsActorInterface =
    std::is_base_of_v<proto::Actor::Client, typename Interface::Client>;
// The server class ActorBase derives from. For an interface that does not extend Actor it is
// Actor's own, so that the static_assert in ActorBase is the first error and the only one of
// troupe's making (no page of "marked override, but does not override" before it).
template <typename Interface>
using ActorServerOf = std::conditional_t<kIsActorInterface<Interface>, typename Interface::Server,
                                         proto::Actor::Server>;
}  // namespace detail

template <typename Interface>
class ActorBase : public detail::ActorServerOf<Interface>, public ActorCore {
  // Base of every actor. `Interface` is the generated Cap'n Proto interface type, which must
  // extend troupe's Actor (`interface X extends(Troupe.Actor)`).
  static_assert(detail::kIsActorInterface<Interface>,
                "troupe::ActorBase<Interface>: Interface must extend troupe's Actor; declare it "
                "as `interface X extends(Troupe.Actor)` with `using Troupe = import "
                "\"/troupe.capnp\";`");

 public:
  using Iface = Interface;
  using Server = detail::ActorServerOf<Interface>;

  explicit ActorBase(ActorContext& context) : ActorCore(context) {}

  capnp::Capability::Server::DispatchCallResult dispatchCall(
      uint64_t interfaceId, uint16_t methodId,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> call) override {
    checkAlive();
    // The Actor interface's own methods (stop, link, ...) are control calls: they must be able to
    // finish while the actor is being stopped, and never wait in its mailbox.
    if (interfaceId == capnp::typeId<proto::Actor>()) {
      return Server::dispatchCall(interfaceId, methodId, call);
    }
    int64_t traced = trace::enabled() ? trace::now() : -1;
    static const MethodTable table = methodTable(capnp::Schema::from<Interface>());
    auto it = table.find({interfaceId, methodId});
    if (it == table.end()) {
      return {
          kj::Promise<void>(unknownCall(capnp::Schema::from<Interface>(), interfaceId, methodId)),
          false};
    }
    const MethodInfo& method = it->second;
    kj::Promise<void> promise = nullptr;
    bool streaming = method.streaming;
    if (method.concurrent) {
      Held held(*this, method);
      auto result = Server::dispatchCall(interfaceId, methodId, call);
      streaming = result.isStreaming;
      promise = withDeadline(guard(kj::mv(result.promise), method), method);
    } else {
      // Through the mailbox; a `-> stream` method too. For those Cap'n Proto holds back every
      // later call to this actor until the stream call has returned (isStreaming), so they keep
      // their order whatever maxConcurrency is, and their flow control: the caller's window
      // counts the time a call waits in the mailbox.
      promise = withDeadline(guard(throughMailbox([this, interfaceId, methodId, call,
                                                   &method]() mutable {
                                     Held held(*this, method);
                                     return Server::dispatchCall(interfaceId, methodId, call)
                                         .promise;
                                   }),
                                   method),
                             method);
    }
    if (traced >= 0) {
      promise = traceCall(kj::mv(promise), capnp::Schema::from<Interface>(), interfaceId, methodId,
                          traced);
    }
    return {kj::mv(promise), streaming};
  }

  kj::Promise<void> stop(proto::Actor::Server::StopContext) override { return stopImpl(); }
  kj::Promise<void> link(proto::Actor::Server::LinkContext call) override {
    return linkImpl(call.getParams().getOther());
  }
  kj::Promise<void> monitor(proto::Actor::Server::MonitorContext call) override {
    return monitorImpl(call.getParams().getWatcher());
  }
  kj::Promise<void> info(proto::Actor::Server::InfoContext call) override {
    infoImpl(call.getResults().initAddress());
    return kj::READY_NOW;
  }
};

}  // namespace troupe
