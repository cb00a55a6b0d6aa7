// File: tls_stream.h
//
// A connection's TLS 1.3 stream, as JobTls makes it (secure.h): OpenSSL does the handshake over
// the stream's own buffers; the records after it are sealed and opened by the stream itself
// (tls_records.h), large reads on a crypto thread (crypto_threads.h).

#pragma once

#include <kj/async-io.h>

#include <cstdint>

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // SSL

namespace troupe::tls {

kj::Promise<kj::Own<kj::AsyncIoStream>> handshake(kj::Own<kj::AsyncIoStream> inner,
                                                  ssl_ctx_st* context, bool server,
                                                  uint64_t rekeyEvery);
// TLS over `inner` as acceptor (`server`) or connector, with `context`'s settings; its keys
// change after `rekeyEvery` records of one key. Resolves with the stream once the handshake is
// done, or rejects saying why: "authentication failed: ..." when the certificate check failed on
// either side.

void keylog(const ssl_st* ssl, const char* line);
// The key-log callback JobTls sets on its context: hands a connection's traffic secrets to its
// stream, which needs them to seal and open records. Ignores connections that are not a stream's.

}  // namespace troupe::tls
