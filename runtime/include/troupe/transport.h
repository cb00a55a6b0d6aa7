// File: troupe/transport.h
//
// The transport under every connection between troupe's nodes, for code that measures it on its
// own: the RPC and stream benches (apps/bench/rpc, apps/bench/stream) run Cap'n Proto over the
// stack a job's nodes use, without a node around it. An app does not need this header:
// troupe::run sets up every connection itself.
//
//     socket -> Tls (TLS 1.3) -> coalesce() -> capnp::TwoPartyVatNetwork
//
//     troupe::transport::Tls tls("a secret both ends know");
//     troupe::transport::setNoDelay(*socket);
//     auto secure = tls.wrapClient(kj::mv(socket)).wait(waitScope);
//     auto stream = troupe::transport::coalesce(kj::mv(secure));
//     capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::CLIENT);
//
// Both are runtime/src/net's own (JobTls, CoalescingStream); docs/security.md says how the TLS is
// keyed, docs/benchmarks.md ("RPC", "Streaming batches") what each layer costs.

#pragma once

#include <kj/async-io.h>
#include <kj/common.h>
#include <kj/memory.h>
#include <kj/string.h>

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace troupe {

class JobTls;  // runtime/src/net/secure.h

namespace transport {

class Tls {
  // TLS 1.3 between two ends that know the same secret, set up as a job's nodes set up theirs:
  // each derives the same key pair and certificate from the secret and trusts only that
  // certificate. One Tls serves any number of connections, both ways.
 public:
  explicit Tls(kj::StringPtr secret);
  // Derives the key pair and certificate (PBKDF2: tens of milliseconds, once).
  ~Tls() noexcept(false);
  KJ_DISALLOW_COPY(Tls);

  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapServer(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapClient(kj::Own<kj::AsyncIoStream> stream);
  // The handshake on `stream` as acceptor / connector; resolves to the encrypted stream. Rejects
  // when the peer does not hold the secret: FAILED, its description starting "authentication
  // failed".

  ssl_ctx_st* context() const;
  // The OpenSSL context of these handshakes, for measuring OpenSSL alone with the same settings.

  static const char* peerName();
  // The name a connector sends (SNI) and expects in the certificate; the same for every end.

 private:
  kj::Own<JobTls> tls;
};

kj::Own<kj::AsyncIoStream> coalesce(kj::Own<kj::AsyncIoStream> stream);
// `stream` behind troupe's coalescing stream, as Cap'n Proto's RPC runs on every troupe
// connection: the small writes of one event-loop turn leave in one syscall, and reads are served
// from a read-ahead buffer. Use it on the event loop that owns `stream`.

void setNoDelay(kj::AsyncIoStream& stream);
// Sets TCP_NODELAY, as every troupe socket has it. Throws if `stream` is not a TCP socket.

}  // namespace transport
}  // namespace troupe
