#include "secure.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <stdexcept>

namespace troupe {

namespace {

template <typename T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Freer<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Freer<BIO, BIO_free_all>>;
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

std::string pem(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, size);
}

// Errors of the certificate check, seen on the side that checks (verify failed) or on the side
// that hears the other's alert.
bool isTrustFailure(kj::StringPtr description) {
  for (const char* mark :
       {"certificate verify failed", "not trusted", "alert unknown ca", "alert bad certificate",
        "alert decrypt error", "alert certificate required", "alert handshake failure"}) {
    if (strstr(description.cStr(), mark) != nullptr) return true;
  }
  return false;
}

kj::Promise<kj::Own<kj::AsyncIoStream>> explainTrust(
    kj::Promise<kj::Own<kj::AsyncIoStream>> handshake) {
  return handshake.catch_([](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
    if (isTrustFailure(e.getDescription())) {
      // OpenSSL's text ends "...:SSL routines::certificate verify failed": keep the reason.
      std::string text = e.getDescription().cStr();
      auto colons = text.rfind("::");
      if (colons != std::string::npos) text = text.substr(colons + 2);
      kj::throwFatalException(KJ_EXCEPTION(
          FAILED, kj::str("authentication failed: the peer does not hold this job's secret (TLS: ",
                          text.c_str(), ")")));
    }
    kj::throwFatalException(kj::mv(e));
  });
}

}  // namespace

JobTls::JobTls(const std::string& secret) {
  Key key = deriveKey(secret);
  Cert cert = selfSigned(key.get());

  Bio keyBio(BIO_new(BIO_s_secmem()));
  Bio certBio(BIO_new(BIO_s_mem()));
  if (!keyBio || !certBio) fail("BIO_new");
  check(PEM_write_bio_PrivateKey(keyBio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr),
        "PEM_write_bio_PrivateKey");
  check(PEM_write_bio_X509(certBio.get(), cert.get()), "PEM_write_bio_X509");
  std::string keyPem = pem(keyBio.get());
  keypair_ = kj::heap<kj::TlsKeypair>(
      kj::TlsKeypair{kj::TlsPrivateKey(kj::StringPtr(keyPem.c_str())),
                     kj::TlsCertificate(kj::StringPtr(pem(certBio.get()).c_str()))});
  OPENSSL_cleanse(keyPem.data(), keyPem.size());

  kj::TlsContext::Options options;
  options.useSystemTrustStore = false;  // trust the job's certificate, nothing else
  options.verifyClients = true;         // the acceptor checks the connector too
  options.trustedCertificates = kj::arrayPtr(&keypair_->certificate, 1);
  options.defaultKeypair = *keypair_;
  // TLS 1.3 only. kj 0.9.2's minVersion stops at TLS 1.2, so leave TLS 1.2 no cipher suite it
  // could use: this one needs an RSA certificate and ours is Ed25519. (The cipher list governs
  // TLS 1.2 and below; TLS 1.3's suites are configured apart and keep OpenSSL's defaults.)
  options.cipherList = "ECDHE-RSA-AES256-GCM-SHA384";
  context_ = kj::heap<kj::TlsContext>(kj::mv(options));
}

JobTls::~JobTls() noexcept(false) {}

kj::Promise<kj::Own<kj::AsyncIoStream>> JobTls::wrapServer(kj::Own<kj::AsyncIoStream> stream) {
  return explainTrust(context_->wrapServer(kj::mv(stream)));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> JobTls::wrapClient(kj::Own<kj::AsyncIoStream> stream) {
  return explainTrust(context_->wrapClient(kj::mv(stream), kPeerName));
}

// =======================================================================================
// PreLoginLimit

PreLoginLimit::PreLoginLimit(kj::Own<kj::AsyncIoStream> inner, size_t budget)
    : inner_(kj::mv(inner)), budget_(budget) {}

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

kj::Promise<void> PreLoginLimit::write(const void* buffer, size_t size) {
  return inner_->write(buffer, size);
}
kj::Promise<void> PreLoginLimit::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  return inner_->write(pieces);
}
kj::Promise<void> PreLoginLimit::whenWriteDisconnected() {
  return inner_->whenWriteDisconnected();
}
void PreLoginLimit::shutdownWrite() {
  inner_->shutdownWrite();
}
void PreLoginLimit::abortRead() {
  inner_->abortRead();
}
void PreLoginLimit::getsockopt(int level, int option, void* value, kj::uint* length) {
  inner_->getsockopt(level, option, value, length);
}
void PreLoginLimit::setsockopt(int level, int option, const void* value, kj::uint length) {
  inner_->setsockopt(level, option, value, length);
}
void PreLoginLimit::getsockname(struct sockaddr* addr, kj::uint* length) {
  inner_->getsockname(addr, length);
}
void PreLoginLimit::getpeername(struct sockaddr* addr, kj::uint* length) {
  inner_->getpeername(addr, length);
}
kj::Maybe<int> PreLoginLimit::getFd() const {
  return inner_->getFd();
}

}  // namespace troupe
