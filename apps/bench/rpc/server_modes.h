// bench_rpc's modes measured against its server child: (a) raw TCP, (b) Cap'n Proto, (b2) Cap'n
// Proto over troupe's coalescing stream, (b3) that over TLS 1.3. Each is a pair: a connect
// function, which makes the client's Caller on a connection, and a serve function, which answers
// on the server child's end of it (bench_rpc.cpp runs both ends, and puts the pairs in its mode
// table).

#pragma once

#include <kj/async-io.h>

#include "measure.h"

namespace troupe::bench {

// (a) The payload written and read back, one write and one read per message (TCP_NODELAY).
kj::Promise<kj::Own<Caller>> connectRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
kj::Promise<void> serveRaw(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);

// (b) An Echo call over a plain capnp::TwoPartyVatNetwork.
kj::Promise<kj::Own<Caller>> connectCapnp(kj::Own<kj::AsyncIoStream> connection,
                                          size_t payloadSize);
kj::Promise<void> serveCapnp(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);

// (b2) The same with troupe's coalescing stream under the network on both ends.
kj::Promise<kj::Own<Caller>> connectCoalescing(kj::Own<kj::AsyncIoStream> connection,
                                               size_t payloadSize);
kj::Promise<void> serveCoalescing(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);

// (b3) (b2) over TLS 1.3, keyed as a job's nodes key theirs: the stack under every troupe
// connection. Both ends do the handshake before the first call.
kj::Promise<kj::Own<Caller>> connectTls(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);
kj::Promise<void> serveTls(kj::Own<kj::AsyncIoStream> connection, size_t payloadSize);

}  // namespace troupe::bench
