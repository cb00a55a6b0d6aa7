#include "tls_records.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include <kj/debug.h>

#include <cstring>

namespace troupe::tls {

namespace {

constexpr size_t kIvBytes = 12;

[[noreturn]] void cryptoFailed(const char* what) {
  kj::throwFatalException(
      kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                    kj::str("TLS record layer: OpenSSL's ", what, " failed")));
}

void check(int ok, const char* what) {
  if (ok <= 0) cryptoFailed(what);
}

const EVP_CIPHER* aeadOf(const SSL_CIPHER* suite) {
  switch (SSL_CIPHER_get_id(suite) & 0xffff) {
    case 0x1301: return EVP_aes_128_gcm();         // TLS_AES_128_GCM_SHA256
    case 0x1302: return EVP_aes_256_gcm();         // TLS_AES_256_GCM_SHA384
    case 0x1303: return EVP_chacha20_poly1305();   // TLS_CHACHA20_POLY1305_SHA256
    default: return nullptr;
  }
}

// HKDF-Expand-Label(secret, label, "", length) of RFC 8446 section 7.1, through OpenSSL's HKDF.
void expandLabel(const EVP_MD* digest, const kj::byte* secret, size_t secretBytes,
                 const char* label, kj::byte* out, size_t length) {
  kj::byte info[2 + 1 + 255 + 1];
  size_t labelBytes = strlen("tls13 ") + strlen(label);
  KJ_ASSERT(labelBytes <= 255);
  size_t n = 0;
  info[n++] = static_cast<kj::byte>(length >> 8);
  info[n++] = static_cast<kj::byte>(length);
  info[n++] = static_cast<kj::byte>(labelBytes);
  memcpy(info + n, "tls13 ", 6);
  memcpy(info + n + 6, label, strlen(label));
  n += labelBytes;
  info[n++] = 0;  // an empty context

  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) cryptoFailed("EVP_KDF_fetch(HKDF)");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) cryptoFailed("EVP_KDF_CTX_new");
  int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST,
                                       const_cast<char*>(EVP_MD_get0_name(digest)), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<kj::byte*>(secret),
                                        secretBytes),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, n),
      OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode), OSSL_PARAM_construct_end()};
  int ok = EVP_KDF_derive(ctx, out, length, params);
  EVP_KDF_CTX_free(ctx);
  check(ok, "HKDF-Expand");
}

kj::Exception broken(kj::StringPtr why) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                       kj::str("TLS: ", why));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pieces

void Pieces::skipEmpty() {
  while (pieces_.size() > 0 && offset_ == pieces_[0].size()) {
    pieces_ = pieces_.slice(1, pieces_.size());
    offset_ = 0;
  }
}

size_t Pieces::sizeUpTo(size_t limit) const {
  size_t n = 0;
  for (size_t i = 0; i < pieces_.size() && n < limit; ++i) {
    n += pieces_[i].size() - (i == 0 ? offset_ : 0);
  }
  return kj::min(n, limit);
}

kj::ArrayPtr<const kj::byte> Pieces::take(size_t limit) {
  if (empty()) return nullptr;
  auto piece = pieces_[0];
  size_t n = kj::min(limit, piece.size() - offset_);
  auto run = piece.slice(offset_, offset_ + n);
  offset_ += n;
  skipEmpty();
  return run;
}

// ---------------------------------------------------------------------------------------------
// TrafficKey

bool TrafficKey::supported(const SSL_CIPHER* suite) {
  return aeadOf(suite) != nullptr;
}

std::string suiteName(const SSL_CIPHER* suite) {
  const char* name = SSL_CIPHER_standard_name(suite);
  return name != nullptr ? name : SSL_CIPHER_get_name(suite);
}

TrafficKey::TrafficKey(const SSL_CIPHER* suite, kj::ArrayPtr<const kj::byte> secret)
    : cipher_(aeadOf(suite)), digest_(SSL_CIPHER_get_handshake_digest(suite)) {
  KJ_REQUIRE(cipher_ != nullptr && digest_ != nullptr, "a TLS suite troupe does not seal",
             suiteName(suite));
  secretBytes_ = EVP_MD_get_size(digest_);
  KJ_REQUIRE(secret.size() == secretBytes_ && secretBytes_ <= sizeof(secret_),
             "a traffic secret of the wrong length", secret.size(), secretBytes_);
  memcpy(secret_, secret.begin(), secretBytes_);
  context_ = EVP_CIPHER_CTX_new();
  if (context_ == nullptr) cryptoFailed("EVP_CIPHER_CTX_new");
  derive();
}

TrafficKey::~TrafficKey() {
  EVP_CIPHER_CTX_free(context_);
  OPENSSL_cleanse(secret_, sizeof(secret_));
  OPENSSL_cleanse(iv_, sizeof(iv_));
}

void TrafficKey::derive() {
  kj::byte key[32];
  size_t keyBytes = EVP_CIPHER_get_key_length(cipher_);
  KJ_ASSERT(keyBytes <= sizeof(key) && EVP_CIPHER_get_iv_length(cipher_) == kIvBytes);
  expandLabel(digest_, secret_, secretBytes_, "key", key, keyBytes);
  expandLabel(digest_, secret_, secretBytes_, "iv", iv_, kIvBytes);
  int ok = EVP_CipherInit_ex(context_, cipher_, nullptr, key, nullptr, 1);
  OPENSSL_cleanse(key, sizeof(key));
  check(ok, "EVP_CipherInit_ex");
  sequence_ = 0;
}

void TrafficKey::update() {
  kj::byte next[64];
  expandLabel(digest_, secret_, secretBytes_, "traffic upd", next, secretBytes_);
  memcpy(secret_, next, secretBytes_);
  OPENSSL_cleanse(next, sizeof(next));
  derive();
}

void TrafficKey::nonce(kj::byte out[12]) const {
  memcpy(out, iv_, kIvBytes);
  for (int i = 0; i < 8; ++i) out[kIvBytes - 1 - i] ^= static_cast<kj::byte>(sequence_ >> (8 * i));
}

size_t TrafficKey::seal(ContentType type, Pieces& plain, size_t bytes, kj::byte* out) {
  KJ_REQUIRE(bytes <= kMaxPlainBytes);
  size_t length = bytes + 1 + kTagBytes;
  kj::byte* header = out;
  header[0] = static_cast<kj::byte>(ContentType::kApplicationData);  // the outer type, always
  header[1] = 0x03;
  header[2] = 0x03;
  header[3] = static_cast<kj::byte>(length >> 8);
  header[4] = static_cast<kj::byte>(length);
  kj::byte iv[kIvBytes];
  nonce(iv);
  check(EVP_CipherInit_ex(context_, nullptr, nullptr, nullptr, iv, 1), "EVP_CipherInit_ex");
  int n = 0;
  check(EVP_CipherUpdate(context_, nullptr, &n, header, kHeaderBytes), "EVP_CipherUpdate(aad)");
  kj::byte* body = out + kHeaderBytes;
  size_t done = 0;
  while (done < bytes) {
    auto run = plain.take(bytes - done);
    KJ_ASSERT(run.size() > 0, "fewer bytes to seal than asked");
    check(EVP_CipherUpdate(context_, body + done, &n, run.begin(), static_cast<int>(run.size())),
          "EVP_CipherUpdate");
    KJ_ASSERT(static_cast<size_t>(n) == run.size());
    done += run.size();
  }
  kj::byte inner = static_cast<kj::byte>(type);
  check(EVP_CipherUpdate(context_, body + bytes, &n, &inner, 1), "EVP_CipherUpdate");
  check(EVP_CipherFinal_ex(context_, body + bytes + 1, &n), "EVP_CipherFinal_ex");
  check(EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_AEAD_GET_TAG, kTagBytes, body + bytes + 1),
        "EVP_CTRL_AEAD_GET_TAG");
  ++sequence_;
  return kHeaderBytes + length;
}

size_t TrafficKey::seal(ContentType type, kj::ArrayPtr<const kj::byte> plain, kj::byte* out) {
  Pieces pieces(kj::arrayPtr(&plain, 1));
  return seal(type, pieces, plain.size(), out);
}

size_t TrafficKey::recordBytes(const kj::byte* header) {
  size_t length = (size_t(header[3]) << 8) | header[4];
  if (header[0] != static_cast<kj::byte>(ContentType::kApplicationData) || header[1] != 0x03 ||
      header[2] != 0x03) {
    kj::throwFatalException(
        broken(kj::str("the peer sent a record that is not TLS 1.3 application data (type ",
                       header[0], ", version ", kj::hex(header[1]), ".", kj::hex(header[2]),
                       "): it does not speak troupe's protocol, or the stream was altered")));
  }
  if (length < 1 + kTagBytes || length > kMaxCipherBytes) {
    kj::throwFatalException(broken(kj::str("the peer sent a record of ", length,
                                           " bytes; TLS 1.3 allows ", 1 + kTagBytes, " to ",
                                           kMaxCipherBytes)));
  }
  return kHeaderBytes + length;
}

TrafficKey::Opened TrafficKey::open(kj::ArrayPtr<const kj::byte> record, kj::byte* out) {
  size_t sealed = record.size() - kHeaderBytes - kTagBytes;
  kj::byte iv[kIvBytes];
  nonce(iv);
  int n = 0;
  check(EVP_CipherInit_ex(context_, nullptr, nullptr, nullptr, iv, 0), "EVP_CipherInit_ex");
  check(EVP_CipherUpdate(context_, nullptr, &n, record.begin(), kHeaderBytes),
        "EVP_CipherUpdate(aad)");
  check(EVP_CipherUpdate(context_, out, &n, record.begin() + kHeaderBytes,
                         static_cast<int>(sealed)),
        "EVP_CipherUpdate");
  kj::byte tag[kTagBytes];
  memcpy(tag, record.end() - kTagBytes, kTagBytes);  // `out` may overwrite the record in place
  check(EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_AEAD_SET_TAG, kTagBytes, tag),
        "EVP_CTRL_AEAD_SET_TAG");
  if (EVP_CipherFinal_ex(context_, out + sealed, &n) <= 0) {
    kj::throwFatalException(broken(
        kj::str("record ", sequence_, " from the peer failed its integrity check (bad record "
                "MAC): the stream was altered on the way, or the peer's keys are not these")));
  }
  ++sequence_;
  size_t end = sealed;
  while (end > 0 && out[end - 1] == 0) --end;  // padding
  if (end == 0) kj::throwFatalException(broken("the peer sent a record with no content type"));
  return {static_cast<ContentType>(out[end - 1]), end - 1};
}

}  // namespace troupe::tls
