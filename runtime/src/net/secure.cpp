#include "secure.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <stdexcept>

#include "tls_stream.h"

namespace troupe {

namespace {

template <typename T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Freer<X509, X509_free>>;
using Extension = std::unique_ptr<X509_EXTENSION, Freer<X509_EXTENSION, X509_EXTENSION_free>>;

[[noreturn]] void fail(const char* what) {
  throw std::runtime_error(std::string("deriving the job's TLS key: ") + what + " failed");
}

void check(int ok, const char* what) {
  if (ok <= 0) fail(what);
}

// The Ed25519 key every node of the job derives from the secret.
Key deriveKey(const std::string& secret) {
  static const char kSalt[] = "troupe job key v1";
  unsigned char seed[32];
  check(PKCS5_PBKDF2_HMAC(secret.data(), static_cast<int>(secret.size()),
                          reinterpret_cast<const unsigned char*>(kSalt), sizeof(kSalt) - 1,
                          JobTls::kKeyIterations, EVP_sha256(), sizeof(seed), seed),
        "PBKDF2");
  Key key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof(seed)));
  OPENSSL_cleanse(seed, sizeof(seed));
  if (!key) fail("EVP_PKEY_new_raw_private_key");
  return key;
}

void addExtension(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  Extension ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  if (!ext) fail("X509V3_EXT_conf_nid");
  check(X509_add_ext(cert, ext.get(), -1), "X509_add_ext");
}

// A self-signed certificate for `key`, the same bytes on every node (Ed25519 signs
// deterministically, and nothing in it depends on the host or the time).
Cert selfSigned(EVP_PKEY* key) {
  Cert cert(X509_new());
  if (!cert) fail("X509_new");
  check(X509_set_version(cert.get(), 2), "X509_set_version");
  check(ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1), "ASN1_INTEGER_set");
  check(ASN1_TIME_set_string(X509_getm_notBefore(cert.get()), "20000101000000Z"), "notBefore");
  check(ASN1_TIME_set_string(X509_getm_notAfter(cert.get()), "99991231235959Z"), "notAfter");
  check(X509_set_pubkey(cert.get(), key), "X509_set_pubkey");
  X509_NAME* name = X509_get_subject_name(cert.get());
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(JobTls::kPeerName), -1,
                                   -1, 0),
        "X509_NAME_add_entry_by_txt");
  check(X509_set_issuer_name(cert.get(), name), "X509_set_issuer_name");
  addExtension(cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  addExtension(cert.get(), NID_key_usage, "critical,digitalSignature,keyCertSign");
  std::string san = std::string("DNS:") + JobTls::kPeerName;
  addExtension(cert.get(), NID_subject_alt_name, san.c_str());
  check(X509_sign(cert.get(), key, nullptr), "X509_sign");  // Ed25519 takes no digest
  return cert;
}

}  // namespace

JobTls::JobTls(const std::string& secret) {
  Key key = deriveKey(secret);
  Cert cert = selfSigned(key.get());
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) fail("SSL_CTX_new");
  context_ = ctx;
  check(SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION), "SSL_CTX_set_min_proto_version");
  check(SSL_CTX_use_certificate(ctx, cert.get()), "SSL_CTX_use_certificate");
  check(SSL_CTX_use_PrivateKey(ctx, key.get()), "SSL_CTX_use_PrivateKey");
  // Trust the job's certificate and nothing else; the acceptor checks the connector too.
  check(X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), cert.get()), "X509_STORE_add_cert");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: connections are few and long
  // The traffic secrets go to the stream, which seals and opens the records (tls_records.h).
  SSL_CTX_set_keylog_callback(ctx, tls::keylog);
  // AES-128-GCM first: both ends are troupe, and it seals a batch stream about a fifth faster
  // than AES-256-GCM with AES-NI (docs/security.md, "What it costs").
  check(SSL_CTX_set_ciphersuites(
            ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"),
        "SSL_CTX_set_ciphersuites");
}

JobTls::~JobTls() noexcept(false) {
  SSL_CTX_free(reinterpret_cast<SSL_CTX*>(context_));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> JobTls::wrapServer(kj::Own<kj::AsyncIoStream> stream) {
  return tls::handshake(kj::mv(stream), context(), true, recordsPerKey_);
}

kj::Promise<kj::Own<kj::AsyncIoStream>> JobTls::wrapClient(kj::Own<kj::AsyncIoStream> stream) {
  return tls::handshake(kj::mv(stream), context(), false, recordsPerKey_);
}

// =======================================================================================
// PreLoginLimit

PreLoginLimit::PreLoginLimit(kj::Own<kj::AsyncIoStream> inner, size_t budget)
    : ForwardingStream(kj::mv(inner)), budget_(budget) {}

kj::Promise<size_t> PreLoginLimit::tryRead(void* buffer, size_t minBytes, size_t maxBytes) {
  if (lifted_) return inner_->tryRead(buffer, minBytes, maxBytes);
  size_t left = budget_ - used_;
  if (left == 0) {
    return KJ_EXCEPTION(DISCONNECTED, kj::str("the peer sent more than ", budget_ / 1024,
                                              " KiB before logging in"));
  }
  maxBytes = kj::min(maxBytes, left);
  minBytes = kj::min(minBytes, maxBytes);
  return inner_->tryRead(buffer, minBytes, maxBytes).then([this](size_t n) {
    used_ += n;
    return n;
  });
}

kj::Maybe<int> PreLoginLimit::getFd() const {
  return inner_->getFd();
}

}  // namespace troupe
