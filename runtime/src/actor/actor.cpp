#include "troupe/actor.h"

#include <unistd.h>

#include <cstdio>

#include "actor/actor_host.h"
#include "actor/rebind.h"
#include "actor/spawn_request.h"
#include "troupe/registry.h"
#include "troupe/exit_codes.h"

namespace troupe {

// The id of troupe.capnp's `concurrent` annotation (fixed there with @0x...).
constexpr uint64_t kConcurrentAnnotationId = 0xd6a4c2e1f3b50917ull;

// =======================================================================================
// Exit, ActorAddress

Exit Exit::fromProto(proto::ExitReason::Reader r) {
  return Exit{r.getKind(), r.getText()};
}

void Exit::toProto(proto::ExitReason::Builder b) const {
  b.setKind(kind);
  b.setText(text);
}

std::string Exit::describe() const {
  static const char* names[] = {"normal", "shutdown", "failed", "killed", "node lost", "no actor"};
  auto k = static_cast<unsigned>(kind);
  return std::string(k < 6 ? names[k] : "unknown") + ": " + text;
}

ActorAddress ActorAddress::fromProto(proto::ActorAddress::Reader r) {
  ActorAddress a;
  a.id = r.getId();
  a.incarnation = r.getIncarnation();
  a.nodeId = r.getNodeId();
  a.host = r.getHost();
  a.group = r.getGroup();
  a.address = r.getAddress();
  a.typeName = r.getTypeName();
  a.name = r.getName();
  a.restartable = r.getRestartable();
  return a;
}

void ActorAddress::toProto(proto::ActorAddress::Builder b) const {
  b.setId(id);
  b.setIncarnation(incarnation);
  b.setNodeId(nodeId);
  b.setHost(host);
  b.setGroup(group);
  b.setAddress(address);
  b.setTypeName(typeName);
  b.setName(name);
  b.setRestartable(restartable);
}

NodeInfo NodeInfo::fromProto(proto::NodeInfo::Reader r) {
  Size size{r.getVcpus(), r.getGpus(), r.getMemoryBytes(), {}, {}};
  for (auto l : r.getLabels()) size.labels[l.getKey()] = l.getValue();
  for (auto c : r.getResources()) size.resources[c.getName()] = c.getMilli() / 1000.0;
  // isHead is not on the wire: a NodeInfo from a peer describes a worker or the head, and the
  // receiver knows which by the host.
  return NodeInfo(r.getHost(), r.getGroup(), r.getInstanceType(), r.getAddress(), false,
                  r.getIncarnation(), kj::mv(size));
}

void NodeInfo::toProto(proto::NodeInfo::Builder b) const {
  b.setHost(host_);
  b.setGroup(group_);
  b.setInstanceType(instanceType_);
  b.setAddress(address_);
  b.setVcpus(size_.vcpus);
  b.setGpus(size_.gpus);
  b.setMemoryBytes(size_.memoryBytes);
  b.setPid(getpid());
  b.setIncarnation(incarnation_);
  auto labels = b.initLabels(size_.labels.size());
  size_t i = 0;
  for (auto& [key, value] : size_.labels) {
    labels[i].setKey(key);
    labels[i++].setValue(value);
  }
  auto resources = b.initResources(size_.resources.size());
  i = 0;
  for (auto& [name, amount] : size_.resources) {
    resources[i].setName(name);
    resources[i++].setMilli(sched::toMilli(amount));
  }
}

std::string ActorAddress::describe() const {
  std::string who = name.empty() ? typeName + " #" + std::to_string(id)
                                 : "'" + name + "' (" + typeName + " #" + std::to_string(id) + ")";
  return who + " on " + host + " (" + group + ")";
}

// =======================================================================================
// Watching an actor: a local Watcher capability that fulfils a promise

namespace {

class PromiseWatcher final : public proto::Watcher::Server {
 public:
  PromiseWatcher(kj::Own<kj::PromiseFulfiller<Exit>> fulfiller,
                 kj::Maybe<kj::Function<void(const Restarted&)>> onRestart)
      : fulfiller_(kj::mv(fulfiller)), onRestart_(kj::mv(onRestart)) {}
  kj::Promise<void> down(DownContext call) override {
    fulfiller_->fulfill(Exit::fromProto(call.getParams().getReason()));
    return kj::READY_NOW;
  }
  kj::Promise<void> restarted(RestartedContext call) override {
    auto p = call.getParams();
    KJ_IF_MAYBE(f, onRestart_) {
      if (fulfiller_->isWaiting()) {
        (*f)(Restarted{p.getId(), p.getIncarnation(), Exit::fromProto(p.getReason())});
      }
    }
    return kj::READY_NOW;
  }

 private:
  kj::Own<kj::PromiseFulfiller<Exit>> fulfiller_;
  kj::Maybe<kj::Function<void(const Restarted&)>> onRestart_;
};

}  // namespace

kj::Promise<Exit> monitorThrough(proto::Cluster::Client cluster, uint64_t id,
                                 kj::Maybe<kj::Function<void(const Restarted&)>> onRestart) {
  auto paf = kj::newPromiseAndFulfiller<Exit>();
  auto req = cluster.monitorRequest();
  req.setTarget(id);
  req.setWatcher(kj::heap<PromiseWatcher>(kj::mv(paf.fulfiller), kj::mv(onRestart)));
  return req.send().then([p = kj::mv(paf.promise)](auto&&) mutable { return kj::mv(p); });
}

namespace {}  // namespace

// =======================================================================================
// ActorContext

kj::Duration stopDeadlineOf(const SpawnOptions& options, const RunOptions& run) {
  KJ_IF_MAYBE(d, options.stopDeadline) {
    return *d;
  }
  return run.stopTimeoutMs * kj::MILLISECONDS;
}

ActorContext::ActorContext(ActorHost& node, ActorAddress self, kj::Array<kj::byte> args,
                           uint32_t index, uint32_t count, CallPolicy policy)
    : node_(node),
      self_(kj::mv(self)),
      index_(index),
      count_(count),
      policy_(kj::mv(policy)),
      argBytes_(kj::mv(args)) {}

const NodeInfo& ActorContext::node() const {
  return node_.info();
}
const SageMakerEnv& ActorContext::sagemaker() const {
  return node_.sagemaker();
}
EventLoop& ActorContext::loop() {
  return node_.loop();
}

kj::Promise<kj::Array<ActorContext::Spawned>> ActorContext::spawnRaw(kj::StringPtr typeName,
                                                                     const Placement& placement,
                                                                     SpawnOptions options,
                                                                     bool many) {
  KJ_REQUIRE(many || !placement.isMultiInstance(), "a multi-instance placement needs spawnMany()",
             placement.describe());
  auto req = node_.cluster().spawnRequest();
  SpawnRequest spec;
  spec.typeName = typeName.cStr();
  spec.name = options.name;
  spec.args = kj::heapArray<kj::byte>(options.argBytes.data(), options.argBytes.size());
  spec.placement = placement;
  spec.parent = self_.id;
  spec.link = options.link;
  spec.maxRestarts = options.maxRestarts;
  spec.restartWindow = options.restartWindow;
  spec.stopTimeout = stopDeadlineOf(options, node_.options());
  spec.maxConcurrency = options.concurrency;
  spec.failCallOnly = options.methodError == MethodError::FAIL_CALL;
  spec.callDeadline = options.deadline;
  spec.waitForCapacity = options.capacityWait;
  spec.toProto(req.initSpec());
  return req.send().then([this](auto response) {
    auto list = response.getActors();
    auto out = kj::heapArrayBuilder<Spawned>(list.size());
    for (auto a : list) {
      auto address = ActorAddress::fromProto(a);
      out.add(Spawned{resolveRaw(address), kj::mv(address)});
    }
    return out.finish();
  });
}

proto::Actor::Client ActorContext::resolveRaw(const ActorAddress& address) {
  auto req = node_.peerNode(address.address).resolveRequest();
  req.setId(address.id);
  return rebinding(node_, address, req.send().getActor());
}

kj::Promise<ActorAddress> ActorContext::lookup(kj::StringPtr name) {
  auto req = node_.cluster().lookupRequest();
  req.setName(name);
  return req.send().then([](auto r) { return ActorAddress::fromProto(r.getActor()); });
}

kj::Promise<ActorAddress> ActorContext::current(uint64_t id) {
  auto req = node_.cluster().resolveRequest();
  req.setId(id);
  return req.send().then([](auto r) { return ActorAddress::fromProto(r.getActor()); });
}

kj::Promise<Exit> ActorContext::monitor(uint64_t id) {
  return monitorThrough(node_.cluster(), id);
}
kj::Promise<Exit> ActorContext::monitor(uint64_t id,
                                        kj::Function<void(const Restarted&)> onRestart) {
  return monitorThrough(node_.cluster(), id, kj::mv(onRestart));
}

kj::Promise<void> ActorContext::link(uint64_t id) {
  auto req = node_.cluster().linkRequest();
  req.setA(self_.id);
  req.setB(id);
  return req.send().ignoreResult();
}

void ActorContext::exit(Exit reason) {
  node_.actorExited(self_.id, kj::mv(reason));
}

// =======================================================================================
// ActorCore

ActorCore::ActorCore(ActorContext& context) : context_(&context) {
  if (trace::enabled()) {
    auto& a = self();
    trace::nameRow(trace::actorRow(a.id), (a.name.empty() ? "" : "'" + a.name + "' ") + a.typeName +
                                              " #" + std::to_string(a.id));
  }
}
ActorCore::~ActorCore() noexcept(false) {}

ActorCore::MethodTable ActorCore::methodTable(capnp::InterfaceSchema schema) {
  MethodTable table;
  auto add = [&table](capnp::InterfaceSchema iface, auto& self) -> void {
    if (iface.getProto().getId() == capnp::typeId<proto::Actor>()) return;
    std::string prefix = iface.getShortDisplayName().cStr();
    for (auto m : iface.getMethods()) {
      MethodInfo info;
      info.name = prefix + "." + m.getProto().getName().cStr();
      info.streaming = m.isStreaming();
      for (auto a : m.getProto().getAnnotations()) {
        if (a.getId() == kConcurrentAnnotationId) info.concurrent = true;
      }
      table.emplace(std::make_pair(iface.getProto().getId(), m.getOrdinal()), kj::mv(info));
    }
    for (auto super : iface.getSuperclasses()) self(super, self);
  };
  add(schema, add);
  return table;
}

kj::Exception ActorCore::unknownCall(capnp::InterfaceSchema schema, uint64_t interfaceId,
                                     uint16_t methodId) const {
  std::string serves;
  bool interfaceKnown = false;
  std::string interfaceName;
  auto walk = [&](capnp::InterfaceSchema iface, auto& self) -> void {
    if (iface.getProto().getId() == interfaceId) {
      interfaceKnown = true;
      interfaceName = actorTypeName(iface);
    }
    serves += (serves.empty() ? "" : ", ") + actorTypeName(iface);
    for (auto super : iface.getSuperclasses()) self(super, self);
  };
  walk(schema, walk);
  std::string who = self().describe();
  if (interfaceKnown) {
    return KJ_EXCEPTION(UNIMPLEMENTED,
                        kj::str(who, " has no method @", methodId, " in ", interfaceName,
                                ": the caller was built from another version of the schema; "
                                "build every instance of the job from the same binary")
                            .cStr());
  }
  char id[32];
  snprintf(id, sizeof(id), "0x%016llx", static_cast<unsigned long long>(interfaceId));
  return KJ_EXCEPTION(
      UNIMPLEMENTED,
      kj::str(who, " was called through another interface (id ", id, ") than the ones it serves (",
              serves,
              "): the reference was made for another type than the one spawned; spawn and call "
              "it as ",
              actorTypeName(schema),
              ", or spawn the type that serves the interface "
              "you call")
          .cStr());
}

class ActorCore::Slot {
  // A place in the mailbox, held while a call runs; given to the next caller when released.
 public:
  explicit Slot(ActorCore& core) : core_(core) {}
  ~Slot() { core_.leaveMailbox(); }
  KJ_DISALLOW_COPY(Slot);

 private:
  ActorCore& core_;
};

kj::Promise<kj::Own<ActorCore::Slot>> ActorCore::enterMailbox() {
  uint32_t limit = kj::max(context_->callPolicy().maxConcurrency, 1u);
  if (running_ < limit && waiting_.empty()) {
    ++running_;
    return kj::heap<Slot>(*this);
  }
  auto paf = kj::newPromiseAndFulfiller<kj::Own<Slot>>();
  waiting_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void ActorCore::leaveMailbox() {
  // The place goes to the first caller still waiting (callers that gave up are skipped); it stays
  // counted in running_ meanwhile.
  while (!waiting_.empty()) {
    auto next = kj::mv(waiting_.front());
    waiting_.pop_front();
    if (next->isWaiting()) {
      next->fulfill(kj::heap<Slot>(*this));
      return;
    }
  }
  --running_;
}

ActorCore::Held::Held(ActorCore& core, const MethodInfo& method)
    : core_(core), method_(method), start_(steadyMicros()) {
  core_.context_->host().methodEntered(core_.self(), &method_.name);
}

ActorCore::Held::~Held() {
  int64_t held = steadyMicros() - start_;
  auto& host = core_.context_->host();
  auto warnMs = host.options().stallWarnMs;
  if (warnMs != 0 && held >= int64_t(warnMs) * 1000) host.loopHeld(core_.self(), method_.name, held);
}

kj::Promise<void> ActorCore::throughMailbox(kj::Function<kj::Promise<void>()> dispatch) {
  ++depth_;
  return enterMailbox()
      .then([dispatch = kj::mv(dispatch)](kj::Own<Slot> slot) mutable {
        return dispatch().attach(kj::mv(slot));
      })
      .attach(kj::defer([this]() { --depth_; }));
}

kj::Promise<void> ActorCore::withDeadline(kj::Promise<void> call, const MethodInfo& method) {
  KJ_IF_MAYBE(d, context_->callPolicy().deadline) {
    auto deadline = *d;
    return call.exclusiveJoin(context_->timer().afterDelay(deadline).then(
        [this, deadline, name = method.name]() -> kj::Promise<void> {
          return deadlineExceeded(self(), name, deadline,
                                  "the actor's call deadline, SpawnOptions::callDeadline; it was "
                                  "cancelled there");
        }));
  }
  return kj::mv(call);
}

kj::Exception deadlineExceeded(const ActorAddress& actor, kj::StringPtr method,
                               kj::Duration deadline, kj::StringPtr where) {
  return KJ_EXCEPTION(OVERLOADED,
                      kj::str("call ", method, " to ", actor.describe(), " did not return within ",
                              deadline / kj::MILLISECONDS, " ms (", where, ")"));
}

namespace {

class DeadlineForwarder final : public capnp::Capability::Server {
  // Ref::within(): forwards each call, failing it past the deadline.
 public:
  DeadlineForwarder(capnp::Capability::Client target, kj::Duration deadline, kj::Timer& timer,
                    capnp::InterfaceSchema schema, ActorAddress address)
      : target_(kj::mv(target)),
        deadline_(deadline),
        timer_(timer),
        schema_(schema),
        address_(kj::mv(address)) {}

  DispatchCallResult dispatchCall(
      uint64_t interfaceId, uint16_t methodId,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) override {
    auto params = context.getParams();
    auto req = target_.typelessRequest(interfaceId, methodId, params.targetSize());
    req.set(params);
    context.releaseParams();
    auto name = methodName(interfaceId, methodId);
    auto call = req.send().then([context](capnp::Response<capnp::AnyPointer> r) mutable {
      context.getResults(r.targetSize()).set(r);
    });
    auto late =
        timer_.afterDelay(deadline_).then([this, name = kj::mv(name)]() -> kj::Promise<void> {
          return deadlineExceeded(address_, name, deadline_, "the caller's deadline, Ref::within");
        });
    return {call.exclusiveJoin(kj::mv(late)), false};
  }

 private:
  std::string methodName(uint64_t interfaceId, uint16_t methodId) {
    auto find = [&](capnp::InterfaceSchema iface, auto& self) -> kj::Maybe<std::string> {
      if (iface.getProto().getId() == interfaceId) {
        auto methods = iface.getMethods();
        if (methodId < methods.size()) {
          return std::string(iface.getShortDisplayName().cStr()) + "." +
                 methods[methodId].getProto().getName().cStr();
        }
        return nullptr;
      }
      for (auto super : iface.getSuperclasses()) {
        KJ_IF_MAYBE(n, self(super, self)) {
          return kj::mv(*n);
        }
      }
      return nullptr;
    };
    KJ_IF_MAYBE(n, find(schema_, find)) {
      return kj::mv(*n);
    }
    return "#" + std::to_string(methodId);
  }

  capnp::Capability::Client target_;
  kj::Duration deadline_;
  kj::Timer& timer_;
  capnp::InterfaceSchema schema_;
  ActorAddress address_;
};

}  // namespace

capnp::Capability::Client withDeadline(capnp::Capability::Client target, kj::Duration deadline,
                                       kj::Timer& timer, capnp::InterfaceSchema schema,
                                       ActorAddress address) {
  return kj::heap<DeadlineForwarder>(kj::mv(target), deadline, timer, schema, kj::mv(address));
}

bool ActorCore::failsActor(kj::StringPtr, const kj::Exception& error) const {
  return !context_->callPolicy().failCallOnly &&
         error.getType() != kj::Exception::Type::UNIMPLEMENTED;
}

void ActorCore::checkAlive() const {
  KJ_IF_MAYBE(e, exited_) {
    kj::throwFatalException(KJ_EXCEPTION(
        DISCONNECTED, kj::str("actor ", self().describe(), " has exited (", e->describe(), ")")));
  }
}

namespace {

kj::Exception exitedDuringCall(const ActorAddress& self, const Exit& reason) {
  return KJ_EXCEPTION(DISCONNECTED, kj::str("actor ", self.describe(), " exited during the call (",
                                            reason.describe(), ")"));
}

}  // namespace

void ActorCore::markExited(const Exit& reason) {
  if (exited_ != nullptr) return;
  exited_ = reason;
  context_->work().close(
      kj::str("actor ", self().describe(), " has exited (", reason.describe(), ")"));
}

void ActorCore::cancelCalls() {
  KJ_IF_MAYBE(e, exited_) {
    canceler_.cancel(exitedDuringCall(self(), *e));
  }
}

kj::Promise<void> ActorCore::guard(kj::Promise<void> call, const MethodInfo& method) {
  // The continuations run while the call's context (and so this server) is alive.
  kj::StringPtr name = method.name.c_str();
  return canceler_.wrap(kj::mv(call))
      .then(
          [this]() -> kj::Promise<void> {
            // A method that ended its actor normally (exit(Exit::normal())) keeps its result.
            KJ_IF_MAYBE(e, exited_) {
              if (e->abnormal()) return exitedDuringCall(self(), *e);
            }
            return kj::READY_NOW;
          },
          [this, name](kj::Exception&& error) -> kj::Promise<void> {
            KJ_IF_MAYBE(e, exited_) {
              if (error.getType() != kj::Exception::Type::DISCONNECTED) {
                return exitedDuringCall(self(), *e);
              }
              return kj::mv(error);
            }
            // An exception escaped the method: as in Erlang, that fails the actor (its restart
            // policy applies), unless it was spawned with MethodError::FAIL_CALL. A method the
            // actor does not implement is the caller's mistake, not the actor's.
            if (failsActor(name, error)) {
              context_->exit(Exit::failed(
                  kj::str("method ", name, " threw: ", error.getDescription()).cStr()));
            }
            return kj::mv(error);
          });
}

kj::Promise<void> ActorCore::traceCall(kj::Promise<void> call, capnp::InterfaceSchema schema,
                                       uint64_t interfaceId, uint16_t methodId, int64_t start) {
  const char* name = "call";
  kj::Maybe<capnp::InterfaceSchema> declaring = schema;
  if (schema.getProto().getId() != interfaceId) declaring = schema.findSuperclass(interfaceId);
  KJ_IF_MAYBE(d, declaring) {
    auto methods = d->getMethods();
    // Compiled-in schema text: it lives as long as the process.
    if (methodId < methods.size()) name = methods[methodId].getProto().getName().cStr();
  }
  return trace::around(kj::mv(call), name, "actor", trace::actorRow(self().id), start);
}

kj::Promise<void> ActorCore::stopImpl() {
  auto req = context_->host().cluster().stopRequest();
  req.setId(self().id);
  return req.send().ignoreResult();
}

kj::Promise<void> ActorCore::linkImpl(uint64_t other) {
  return context_->link(other);
}

kj::Promise<void> ActorCore::monitorImpl(proto::Watcher::Client watcher) {
  auto req = context_->host().cluster().monitorRequest();
  req.setTarget(self().id);
  req.setWatcher(kj::mv(watcher));
  return req.send().ignoreResult();
}

// =======================================================================================
// Registry

std::string Registry::names() const {
  std::string out;
  for (auto& [name, f] : factories_) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "(none)" : out;
}

Registry::Created Registry::create(const std::string& typeName,
                                   kj::Own<ActorContext> context) const {
  auto it = factories_.find(typeName);
  if (it == factories_.end()) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED,
        kj::str("actor type '", typeName, "' is not registered; registered types: ", names())));
  }
  return it->second(kj::mv(context));
}

// =======================================================================================

const char* exitCodeName(int code) {
  switch (code) {
    case OK:
      return "OK";
    case JOB_FAILED:
      return "JOB_FAILED";
    case CONFIG_ERROR:
      return "CONFIG_ERROR";
    case HEAD_LOST:
      return "HEAD_LOST";
    case AUTH_FAILED:
      return "AUTH_FAILED";
    case JOIN_FAILED:
      return "JOIN_FAILED";
    case INTERRUPTED:
      return "INTERRUPTED";
    case FENCED:
      return "FENCED";
    case INTERNAL_ERROR:
      return "INTERNAL_ERROR";
  }
  return "UNKNOWN";
}

}  // namespace troupe
