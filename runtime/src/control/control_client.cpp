// The control path's worker side (control.h): the client that beats to the head's control server,
// reconnects, and tells its node what it saw (a fence, a stall of its own).
#include <capnp/message.h>
#include <capnp/serialize-async.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "control/control.h"
#include "control/control_wire.h"
#include "troupe.capnp.h"

namespace troupe {

using control_wire::Clock;
using control_wire::msBetween;

ControlClient::ControlClient(ControlSettings settings, std::string headAddress, uint32_t nodeId)
    : ControlThread(std::move(settings)), headAddress_(std::move(headAddress)), nodeId_(nodeId) {
  start();
}

ControlClient::~ControlClient() { stop(); }

int64_t ControlClient::sinceHeardMs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return msBetween(lastHeard_, Clock::now());
}

bool ControlClient::answered() {
  std::lock_guard<std::mutex> lock(mutex_);
  return answered_ > 0;
}

std::optional<std::string> ControlClient::fenced() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fenced_;
}

int64_t ControlClient::frozenMs() {
  // Also a stall not over yet: read right after a thaw, before this thread's timer has run.
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, Clock::now());
  return std::max(frozenMs_, late > int64_t(settings_.nodeTimeoutMs) ? late : 0);
}

std::string ControlClient::frozenNote() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (frozenMs_ > 0) return throttleNote(frozenHeld_, frozenMs_);
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, Clock::now());
  return late > int64_t(settings_.nodeTimeoutMs) ? throttleNote(throttle_.since(), late) : "";
}

std::string ControlClient::stallNote() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  // A stall not over yet for this thread: thawed, its timer has not run (a fence read first).
  int64_t late = nextBeat_ == SteadyTime::max() ? 0 : msBetween(nextBeat_, now);
  if (late > int64_t(settings_.heartbeatMs)) {
    return "; this node's control thread is " + std::to_string(late) +
           " ms behind its heartbeats" + throttleNote(throttle_.since(), late);
  }
  auto ago = msBetween(stallAt_, now);
  if (stallMs_ == 0 || ago > 60000) return "";
  return "; this node's control thread had stalled " + std::to_string(stallMs_) + " ms, " +
         std::to_string(ago) + " ms before" + throttleNote(stallHeld_, stallMs_);
}

std::string ControlClient::roundTrips() {
  std::vector<float> ms;
  uint64_t answered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ms = roundTripsMs_;
    answered = answered_;
  }
  if (ms.empty()) return "no heartbeat answered";
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, size_t(q * ms.size()))]; };
  char text[160];
  std::snprintf(text, sizeof text,
                "%llu heartbeats answered, round trip p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                (unsigned long long)answered, at(0.5), at(0.99), ms.back());
  return text;
}

kj::Promise<void> ControlClient::serve(kj::AsyncIoContext& io) {
  struct Session {
    ControlClient& client;
    kj::AsyncIoContext& io;
    kj::Own<JobTls> ownTls;
    JobTls* tls = nullptr;
    uint64_t seq = 0;
    std::map<uint64_t, SteadyTime> sent;  // beats not answered yet
    kj::Duration backoff = 100 * kj::MILLISECONDS;

    kj::Promise<void> connect() {
      auto& s = client.settings_;
      return io.provider->getNetwork()
          .parseAddress(client.headAddress_)
          .then([](kj::Own<kj::NetworkAddress> address) {
            return address->connect().attach(kj::mv(address));
          })
          .then([this, &s](kj::Own<kj::AsyncIoStream> stream) {
            return control_wire::wrap(io.provider->getTimer(), tls, kj::mv(stream), false,
                               s.loginTimeoutMs);
          })
          .then([this, &s](kj::Own<kj::AsyncIoStream> stream) {
            auto hello = kj::heap<capnp::MallocMessageBuilder>(64);
            auto h = hello->initRoot<proto::ControlHello>();
            h.setNodeId(client.nodeId_);
            if (s.insecure) h.setToken(kj::StringPtr(s.secret.c_str()).asBytes());
            auto& ref = *stream;
            auto& out = *hello;
            return capnp::writeMessage(ref, out)
                .attach(kj::mv(hello))
                .then([this, &ref]() {
                  backoff = 100 * kj::MILLISECONDS;
                  sent.clear();
                  // The first heartbeat at once: a node is heard within a round trip of joining.
                  return beat(ref, 0).exclusiveJoin(read(ref));
                })
                .attach(kj::mv(stream));
          })
          .catch_([this](kj::Exception&& e) {
            spdlog::debug("control path to the head {}: {}; reconnecting", client.headAddress_,
                          e.getDescription().cStr());
            auto delay = backoff;
            backoff = kj::min(backoff * 2, client.settings_.heartbeatMs * kj::MILLISECONDS);
            return io.provider->getTimer().afterDelay(delay).then([this]() { return connect(); });
          });
    }

    kj::Promise<void> beat(kj::AsyncIoStream& stream, unsigned every) {
      auto expected = Clock::now() + std::chrono::milliseconds(every);
      {
        std::lock_guard<std::mutex> lock(client.mutex_);
        client.nextBeat_ = expected;
      }
      return io.provider->getTimer()
          .afterDelay(every * kj::MILLISECONDS)
          .then([this, &stream, expected]() {
            auto now = Clock::now();
            int64_t late = std::max<int64_t>(0, msBetween(expected, now));
            ThrottleWatch::Held held;
            {
              // However late this round runs is this thread's own stall (the process was frozen
              // or starved): the head's answers may be waiting unread. It is not the head's
              // silence. Past the node timeout the head has fenced this node, unless an answer
              // to a heartbeat sent after the stall says otherwise.
              std::lock_guard<std::mutex> lock(client.mutex_);
              client.nextBeat_ = SteadyTime::max();  // not waiting on the timer while it writes
              client.lastHeard_ = std::min(now, client.lastHeard_ + std::chrono::milliseconds(late));
              held = client.throttle_.since();
              client.throttle_.mark();
              if (late > client.settings_.heartbeatMs &&
                  (late >= client.stallMs_ || now - client.stallAt_ > std::chrono::minutes(1))) {
                client.stallMs_ = late;
                client.stallHeld_ = held;
                client.stallAt_ = now;
              }
              if (late > client.settings_.nodeTimeoutMs) {
                client.frozenMs_ = late;
                client.frozenHeld_ = held;
                client.thawedAt_ = now;
              }
            }
            if (late > client.settings_.heartbeatMs) {
              spdlog::warn("this node's control thread stalled for {} ms{}", late,
                           throttleNote(held, late));
            }
            auto message = kj::heap<capnp::MallocMessageBuilder>(64);
            message->initRoot<proto::ControlBeat>().setSeq(++seq);
            sent[seq] = now;
            while (sent.size() > 1000) sent.erase(sent.begin());
            auto& out = *message;
            return capnp::writeMessage(stream, out).attach(kj::mv(message));
          })
          .then([this, &stream]() { return beat(stream, client.settings_.heartbeatMs); });
    }

    kj::Promise<void> read(kj::AsyncIoStream& stream) {
      return capnp::readMessage(stream, control_wire::readerOptions())
          .then([this, &stream](kj::Own<capnp::MessageReader> message) {
            auto ack = message->getRoot<proto::ControlAck>();
            auto now = Clock::now();
            auto it = sent.find(ack.getSeq());
            {
              std::lock_guard<std::mutex> lock(client.mutex_);
              client.lastHeard_ = now;
              if (client.answered_ == 0 && it == sent.end()) ++client.answered_;
              if (it != sent.end()) {
                float ms = std::chrono::duration<float, std::milli>(now - it->second).count();
                auto& ring = client.roundTripsMs_;
                if (ring.size() < 10000) {
                  ring.push_back(ms);
                } else {
                  ring[client.answered_ % ring.size()] = ms;
                }
                ++client.answered_;
              }
              if (ack.getFenced()) {
                if (!client.fenced_) client.fenced_ = std::string(ack.getReason().cStr());
              } else if (it != sent.end() && it->second >= client.thawedAt_) {
                client.frozenMs_ = 0;
              }
            }
            if (it != sent.end()) sent.erase(sent.begin(), std::next(it));
            return read(stream);
          });
    }
  };
  auto session = kj::heap<Session>(Session{*this, io, kj::Own<JobTls>()});
  if (!settings_.insecure) {
    session->tls = settings_.tls;
    if (session->tls == nullptr) {
      session->ownTls = kj::heap<JobTls>(settings_.secret);
      session->tls = session->ownTls.get();
    }
  }
  auto& s = *session;
  return s.connect().attach(kj::mv(session));
}

}  // namespace troupe
