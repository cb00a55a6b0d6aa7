// File: secure.h
//
// How a node trusts a connection (docs/security.md has the threat model):
//
//   * JobTls: every node-to-node connection is TLS 1.3 (OpenSSL 3), and both ends prove they hold
//     the job secret without sending it. Every node derives the same Ed25519 key pair from the
//     secret (PBKDF2-HMAC-SHA256) and the same self-signed certificate for it, presents that
//     certificate, and trusts exactly that certificate: a peer that completes the handshake
//     signed it with the key only the secret yields. OpenSSL does the handshake; the records
//     after it are sealed and opened by the stream itself with the keys it agreed
//     (tls_records.h), in one pass from the writer's bytes and into the reader's, with large
//     socket reads and writes (docs/benchmarks.md, "Streaming batches", "Encrypted ingest").
//   * PreLoginLimit: until its peer has logged in, a connection may carry only a few KiB, so a
//     stranger cannot make a node buffer a 60 MiB message.
//
//     TLS on:   socket -> PreLoginLimit -> TLS -> CoalescingStream -> Cap'n Proto RPC
//     insecure: socket -> PreLoginLimit -> CoalescingStream -> Cap'n Proto RPC

#pragma once

#include <kj/async-io.h>
#include <kj/debug.h>

#include <string>

#include "forwarding_stream.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace troupe {

class JobTls {
 public:
  explicit JobTls(const std::string& secret);
  // Derives the key pair and certificate (PBKDF2 with kKeyIterations rounds: tens of ms, once).
  ~JobTls() noexcept(false);
  KJ_DISALLOW_COPY(JobTls);

  static constexpr unsigned kKeyIterations = 100000;
  static constexpr const char* kPeerName = "troupe-node";
  // The name in the certificate (subjectAltName) and the one a client expects; it is the same for
  // every node, since all share one certificate. It is sent in clear (SNI); it names nothing.

  static constexpr uint64_t kRecordsPerKey = uint64_t(1) << 23;
  // A connection's keys are replaced (TLS 1.3's KeyUpdate) after this many records of one key:
  // 128 GiB of 16 KiB records, under the 2^24.5 records RFC 8446 section 5.5 allows AES-GCM.
  void rekeyEvery(uint64_t records) { recordsPerKey_ = records; }
  // For tests: a small number makes the keys change within a short stream.

  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapServer(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapClient(kj::Own<kj::AsyncIoStream> stream);

  ssl_ctx_st* context() const { return reinterpret_cast<ssl_ctx_st*>(context_); }
  // The OpenSSL context every connection of the job uses (bench_stream measures OpenSSL alone
  // with exactly these settings).
  // The handshake as acceptor / connector. Rejects when the peer does not hold the secret: with
  // a FAILED exception whose description starts "authentication failed" when the certificate
  // check failed (on either side), else with what OpenSSL or the socket said.

 private:
  void* context_ = nullptr;  // SSL_CTX; OpenSSL's headers stay out of this one
  uint64_t recordsPerKey_ = kRecordsPerKey;
};

class PreLoginLimit final : public ForwardingStream {
  // A decorator that fails reads once the peer has sent more than `budget` bytes, until lift()
  // is called (the peer logged in). Everything else, getFd() included, is forwarded to `inner`.
 public:
  PreLoginLimit(kj::Own<kj::AsyncIoStream> inner, size_t budget);
  void lift() { lifted_ = true; }
  bool exceeded() const { return !lifted_ && used_ >= budget_; }

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override;
  kj::Maybe<int> getFd() const override;

 private:
  size_t budget_;
  size_t used_ = 0;
  bool lifted_ = false;
};

constexpr size_t kPreLoginTlsBytes = 16 * 1024;
// What a peer may send before its TLS handshake completes: a troupe client's handshake is about
// 1.5 KiB (ClientHello, certificate, CertificateVerify, Finished).
constexpr size_t kPreLoginPlainBytes = 64 * 1024;
// With --insecure, what a peer may send before its login call has been answered: the login and
// the calls a client pipelines on its result (a join, a spawn).

}  // namespace troupe
