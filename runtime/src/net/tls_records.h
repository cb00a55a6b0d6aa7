// File: tls_records.h
//
// TLS 1.3's record layer (RFC 8446 section 5) for a connection whose handshake OpenSSL did.
//
// Why troupe seals its own records: OpenSSL 3.0 copies each record's plaintext into its own
// buffer, encrypts it there and hands the ciphertext to a BIO, which copies it again; reading, it
// copies ciphertext into its buffer, decrypts in place and copies the plaintext out. For a 25 MB
// batch those copies cost as much as the AES itself (docs/benchmarks.md, "Encrypted ingest").
// The kernel's TLS (the `tls` ULP) avoids them by taking the keys after the handshake; this does
// the same in user space: OpenSSL still negotiates, authenticates and derives the traffic
// secrets, and a record is then sealed in one pass from the caller's bytes into the socket's
// write buffer, and opened in one pass from the socket's read buffer into the reader's memory.
// The cipher is the suite the handshake agreed (AES-128-GCM first, see JobTls), through
// OpenSSL's EVP, which uses AES-NI and VAES where the CPU has them.
//
// What this layer does of the protocol: application data; close_notify and other alerts; the
// KeyUpdate message, sent after `rekeyEvery` records of one key (RFC 8446 section 5.5 limits
// AES-GCM to 2^24.5 records per key) and obeyed when the peer sends one; NewSessionTicket is
// ignored. Records are never padded; a peer's padding is accepted.

#pragma once

#include <kj/array.h>
#include <kj/common.h>

#include <cstdint>
#include <string>

struct ssl_cipher_st;        // OpenSSL's SSL_CIPHER
struct evp_cipher_ctx_st;    // EVP_CIPHER_CTX
struct evp_cipher_st;        // EVP_CIPHER
struct evp_md_st;            // EVP_MD

namespace troupe::tls {

enum class ContentType : uint8_t { kAlert = 21, kHandshake = 22, kApplicationData = 23 };

constexpr size_t kMaxPlainBytes = 16384;  // 2^14, a record's plaintext at most
constexpr size_t kHeaderBytes = 5;        // type, legacy version, length
constexpr size_t kTagBytes = 16;          // every TLS 1.3 suite's AEAD tag
constexpr size_t kMaxCipherBytes = kMaxPlainBytes + 256;  // what a peer may send (padding included)
constexpr size_t kMaxRecordBytes = kHeaderBytes + kMaxCipherBytes;
constexpr size_t kSealOverhead = kHeaderBytes + 1 + kTagBytes;  // a sealed record over its payload

class Pieces {
  // The bytes of a gather write, consumed from the front.
 public:
  explicit Pieces(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) : pieces_(pieces) {
    skipEmpty();
  }
  bool empty() const { return pieces_.size() == 0; }
  size_t sizeUpTo(size_t limit) const;  // min(limit, bytes left)
  kj::ArrayPtr<const kj::byte> take(size_t limit);  // the next run of at most `limit` bytes

 private:
  void skipEmpty();
  kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces_;
  size_t offset_ = 0;  // into pieces_[0]
};

class TrafficKey {
  // One direction's key: the traffic secret, the AEAD key and IV it yields (RFC 8446 section
  // 7.3), and the record sequence number. Not thread-safe; one thread at a time may use it.
 public:
  TrafficKey(const ssl_cipher_st* suite, kj::ArrayPtr<const kj::byte> secret);
  ~TrafficKey();
  KJ_DISALLOW_COPY(TrafficKey);

  static bool supported(const ssl_cipher_st* suite);
  // Whether this layer knows the suite's AEAD (the three TLS 1.3 suites JobTls allows).

  size_t seal(ContentType type, Pieces& plain, size_t bytes, kj::byte* out);
  // Seals the next `bytes` (<= kMaxPlainBytes) of `plain` as one record of `type` into `out`,
  // which has room for bytes + kSealOverhead; returns the record's size.
  size_t seal(ContentType type, kj::ArrayPtr<const kj::byte> plain, kj::byte* out);

  static size_t recordBytes(const kj::byte* header);
  // The whole size of the record whose 5-byte header this is; throws (DISCONNECTED, saying what
  // arrived) when it is not a TLS 1.3 application_data record of a size a peer may send.

  struct Opened {
    ContentType type;
    size_t bytes;  // of plaintext, at the front of `out`
  };
  Opened open(kj::ArrayPtr<const kj::byte> record, kj::byte* out);
  // Decrypts and checks a whole record (header included) into `out`, which has room for
  // record.size() - kHeaderBytes - kTagBytes bytes (`out` may be the record's own payload: in
  // place). Throws DISCONNECTED when the record fails its check; then nothing of `out` counts.

  void update();
  // The next generation (KeyUpdate): secret = HKDF-Expand-Label(secret, "traffic upd", "", Hash).
  uint64_t records() const { return sequence_; }  // sealed or opened with this generation

 private:
  void derive();
  void nonce(kj::byte out[12]) const;

  const evp_cipher_st* cipher_;
  const evp_md_st* digest_;
  evp_cipher_ctx_st* context_;
  kj::byte secret_[64];
  size_t secretBytes_;
  kj::byte iv_[12];
  uint64_t sequence_ = 0;
};

std::string suiteName(const ssl_cipher_st* suite);  // "TLS_AES_128_GCM_SHA256"

}  // namespace troupe::tls
