// troupe::fetchStatus(): the client side of Gate.status, for `troupe status` (troupe/status.h).

#include <capnp/rpc-twoparty.h>

#include "node/node.h"
#include "net/secure.h"
#include "troupe/exit_codes.h"
#include "troupe/status.h"

namespace troupe {

namespace {

// Where an exchange with a node failed, for the message.
enum class Stage { CONNECTING, HANDSHAKE, ASKING };

const char* stageText(Stage stage) {
  switch (stage) {
    case Stage::CONNECTING:
      return "connecting";
    case Stage::HANDSHAKE:
      return "in the TLS handshake";
    case Stage::ASKING:
      return "waiting for the answer";
  }
  return "";
}

// What one node said: the head's snapshot, or (a worker) where the head is.
struct Answer {
  JobStatus status;
  std::string head, headAddress;  // set when the node was a worker
};

JobStatus fromProto(proto::JobStatus::Reader r) {
  JobStatus s;
  s.head = r.getHead();
  s.headAddress = r.getHeadAddress();
  s.phase = r.getPhase();
  s.uptimeMs = r.getUptimeMs();
  for (auto n : r.getNodes()) {
    StatusNode node;
    node.info = NodeInfo::fromProto(n.getInfo());
    node.pid = n.getInfo().getPid();
    node.state = n.getState();
    node.head = node.info.host() == s.head;
    node.heartbeatAgeMs = n.getHeartbeatAgeMs();
    node.loadAgeMs = n.getLoadAgeMs();
    node.loadKnown = node.loadAgeMs >= 0;
    node.cpuPercent = n.getLoad().getCpuPercent();
    node.cpuIntervalMs = n.getLoad().getIntervalMs();
    node.loopHolds = n.getLoad().getHolds();
    node.longestHoldMs = n.getLoad().getLongestHoldMs();
    node.longestHoldBy = n.getLoad().getLongestHoldBy();
    node.why = n.getWhy();
    s.nodes.push_back(kj::mv(node));
  }
  for (auto g : r.getGroups()) {
    StatusGroup group;
    group.name = g.getName();
    group.instanceType = g.getInstanceType();
    for (auto h : g.getHosts()) group.hosts.push_back(h);
    group.alive = g.getAlive();
    s.groups.push_back(kj::mv(group));
  }
  for (auto a : r.getActors()) {
    StatusActor actor;
    actor.address = ActorAddress::fromProto(a.getAddress());
    actor.state = a.getState();
    actor.mailbox = a.getCalls();
    actor.parent = a.getParent();
    s.actors.push_back(kj::mv(actor));
  }
  return s;
}

// The exception of a failed exchange with `address`, as a StatusError a person can act on.
StatusError explain(const kj::Exception& e, Stage stage, const std::string& address,
                    const StatusRequest& request) {
  std::string what = e.getDescription().cStr();
  if (what.find("authentication failed") != std::string::npos) {
    if (!request.insecure) {
      auto begin = what.find("(TLS: ");
      auto tls = begin == std::string::npos
                     ? what
                     : what.substr(begin + 1, what.find(')', begin) - begin - 1);
      return StatusError(AUTH_FAILED, "authentication failed: the node at " + address +
                                          " and this client hold different job secrets (" + tls +
                                          "); give it the job's secret (--token-file FILE, "
                                          "TROUPE_TOKEN_FILE)");
    }
    return StatusError(AUTH_FAILED, "authentication failed: the node at " + address +
                                        " refused this client's cluster token; give it the "
                                        "job's secret (--token-file FILE, TROUPE_TOKEN_FILE)");
  }
  if (e.getType() == kj::Exception::Type::OVERLOADED) {
    return StatusError(JOIN_FAILED, "no answer from " + address + " within " +
                                        std::to_string(request.timeoutMs) + " ms (" +
                                        stageText(stage) +
                                        "); is it the address of a running troupe job's node?");
  }
  switch (stage) {
    case Stage::CONNECTING:
      return StatusError(JOIN_FAILED, "no troupe job at " + address + ": " + what +
                                          "; check the address (troupe sim prints one line per "
                                          "instance) and that the job is still running");
    case Stage::HANDSHAKE:
      return StatusError(JOIN_FAILED,
                         "the TLS handshake with " + address + " failed (" + what +
                             "); is it a troupe node? A job started with --insecure needs "
                             "--insecure here too");
    case Stage::ASKING:
      break;
  }
  return StatusError(JOIN_FAILED,
                     "no status from " + address + ": " + what +
                         (request.insecure ? "; a job started without --insecure (TLS, the "
                                             "default) needs this client without it too"
                                           : ""));
}

Answer ask(EventLoop& loop, JobTls* tls, const StatusRequest& request, const std::string& address) {
  Stage stage = Stage::CONNECTING;
  kj::Own<Connection> connection;
  auto exchange =
      loop.io()
          .getNetwork()
          .parseAddress(address)
          .then([](kj::Own<kj::NetworkAddress> to) {
            auto connecting = to->connect();
            return connecting.attach(kj::mv(to));
          })
          .then([&](kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
            stage = Stage::HANDSHAKE;
            if (tls == nullptr) return kj::mv(stream);
            return tls->wrapClient(kj::mv(stream));
          })
          .then([&](kj::Own<kj::AsyncIoStream> stream) {
            stage = Stage::ASKING;
            connection = kj::heap<Connection>(
                kj::heap<CoalescingStream>(kj::mv(stream)), capnp::rpc::twoparty::Side::CLIENT,
                capnp::Capability::Client(nullptr), capnp::ReaderOptions(), address);
            auto req = connection->peerBootstrap().castAs<proto::Gate>().statusRequest();
            if (tls == nullptr) req.setToken(kj::StringPtr(request.secret.c_str()).asBytes());
            return req.send();
          })
          .then([](capnp::Response<proto::Gate::StatusResults> r) {
            Answer a;
            if (r.hasStatus()) a.status = fromProto(r.getStatus());
            a.head = r.getHead();
            a.headAddress = r.getHeadAddress();
            return a;
          });
  try {
    return loop.timer()
        .timeoutAfter(request.timeoutMs * kj::MILLISECONDS, kj::mv(exchange))
        .wait(loop.waitScope());
  } catch (const kj::Exception& e) {
    throw explain(e, stage, address, request);
  }
}

}  // namespace

JobStatus fetchStatus(EventLoop& loop, const StatusRequest& request) {
  kj::Own<JobTls> tls;
  if (!request.insecure) tls = kj::heap<JobTls>(request.secret);
  auto answer = ask(loop, tls.get(), request, request.address);
  if (answer.headAddress.empty()) return kj::mv(answer.status);
  // A worker: ask the head it names, once.
  auto worker = request.address;
  if (answer.headAddress != worker) {
    answer = ask(loop, tls.get(), request, answer.headAddress);
    if (answer.headAddress.empty()) return kj::mv(answer.status);
  }
  throw StatusError(JOIN_FAILED, "the node at " + worker + " says its head is " + answer.head +
                                     " at " + answer.headAddress +
                                     ", which does not answer as a head yet; the job may still "
                                     "be starting: try again");
}

}  // namespace troupe
