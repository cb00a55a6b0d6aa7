// What the head's control server and a worker's control client share on the wire: the reader's
// limits, the socket's options and the TLS wrap of a control connection. Internal to control/.
#pragma once

#include <capnp/message.h>
#include <kj/async-io.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <chrono>
#include <cstdint>

#include "net/secure.h"
#include "control/control.h"

namespace troupe::control_wire {

using Clock = std::chrono::steady_clock;

inline int64_t msBetween(SteadyTime from, SteadyTime to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

inline capnp::ReaderOptions readerOptions() {
  // A control message is a few words: a stranger cannot make this thread buffer more.
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1024;
  o.nestingLimit = 8;
  return o;
}

inline void setNoDelay(kj::AsyncIoStream& stream) {
  int one = 1;
  stream.setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The stream as the job's TLS wraps it (when the job has TLS), its handshake bounded in time.
inline kj::Promise<kj::Own<kj::AsyncIoStream>> wrap(kj::Timer& timer, JobTls* tls,
                                                   kj::Own<kj::AsyncIoStream> stream, bool server,
                                                   unsigned timeoutMs) {
  setNoDelay(*stream);
  if (tls == nullptr) return kj::mv(stream);
  auto handshake = server ? tls->wrapServer(kj::mv(stream)) : tls->wrapClient(kj::mv(stream));
  return timer.timeoutAfter(timeoutMs * kj::MILLISECONDS, kj::mv(handshake));
}

}  // namespace troupe::control_wire
