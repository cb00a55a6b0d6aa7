#include "tls_stream.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <kj/debug.h>

#include <cstring>
#include <string>
#include <vector>

#include "crypto_threads.h"
#include "forwarding_stream.h"
#include "secure.h"
#include "tls_records.h"

namespace troupe::tls {

namespace {

[[noreturn]] void fail(const char* what) {
  kj::throwFatalException(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                        kj::str("TLS: OpenSSL's ", what, " failed")));
}

void check(int ok, const char* what) {
  if (ok <= 0) fail(what);
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

// The reason of the last OpenSSL error ("certificate verify failed"), or `fallback`.
std::string opensslReason(const char* fallback) {
  unsigned long code = ERR_peek_last_error();
  const char* reason = code != 0 ? ERR_reason_error_string(code) : nullptr;
  ERR_clear_error();
  return reason != nullptr ? reason : fallback;
}


// =======================================================================================
// TlsStream

// The BIO method behind every TlsStream's handshake: OpenSSL reads ciphertext from, and writes it
// to, the stream's own buffers (no memory BIO in between).
BIO_METHOD* streamBioMethod();


class TlsStream final : public ForwardingStream {
  // TLS 1.3 over `inner`. OpenSSL does the handshake, through the BIO below; from then on the
  // stream seals and opens records itself with the traffic keys the handshake agreed
  // (tls_records.h says why). Ciphertext moves to and from the socket in reads of up to
  // kReadBytes and writes of up to kSealBytes, so a 25 MB batch costs a hundred socket calls and
  // event-loop turns, not thousands. A record is sealed straight from the caller's bytes into the
  // write buffer in use, and opened straight from the read buffer into the reader's memory: a
  // byte is copied by the kernel and passed once through the AEAD, as with the kernel's TLS. A
  // full write buffer goes to the socket while the next one fills, and sent buffers are reused.
  // One read and one write may be in progress at a time, as for any AsyncIoStream.
  //
  // A reader that asks for a large message has each run of at least kOffloadBytes of whole
  // records opened on a crypto thread (crypto_threads.h) while the socket fills the other read
  // buffer: several streams into one node are decrypted on several cores.
 public:
  static constexpr size_t kReadBytes = 256 * 1024;
  static constexpr size_t kOffloadBytes = 64 * 1024;
  static constexpr size_t kStreamReadBytes = 1024 * 1024;
  // The read buffers of a stream that offloads: a crypto thread opens a megabyte per hand-off.
  static constexpr size_t kSealBytes = 1024 * 1024;
  static constexpr size_t kSealCapacity = kSealBytes + 2 * kMaxRecordBytes;
  // A buffer is sent once it holds kSealBytes; the record that crossed that line and a KeyUpdate
  // after it still fit.
  static constexpr size_t kSpareBuffers = 2;
  static constexpr size_t kSealElsewhereBytes = 256 * 1024;
  // A write with at least this much left is sealed a buffer at a time on a crypto thread, where
  // CryptoThreads::sealElsewhere() says the machine has CPUs for it.

  TlsStream(kj::Own<kj::AsyncIoStream> inner, SSL_CTX* ctx, bool server, uint64_t rekeyEvery)
      : ForwardingStream(kj::mv(inner)),
        server_(server),
        rekeyEvery_(rekeyEvery),
        readBuffer_(kj::heapArray<kj::byte>(kReadBytes)),
        sealed_(newSealBuffer()),
        sending_(kj::Promise<void>(kj::READY_NOW).fork()) {
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr) fail("SSL_new");
    SSL_set_app_data(ssl_, this);  // for keylog(): the traffic secrets come back to this stream
    BIO* bio = BIO_new(streamBioMethod());
    if (bio == nullptr) fail("BIO_new");
    BIO_set_data(bio, this);
    BIO_set_init(bio, 1);
    SSL_set_bio(ssl_, bio, bio);  // one BIO for both directions; the SSL owns it
    if (!server_) {
      check(SSL_set_tlsext_host_name(ssl_, JobTls::kPeerName), "SSL_set_tlsext_host_name");
      check(X509_VERIFY_PARAM_set1_host(SSL_get0_param(ssl_), JobTls::kPeerName, 0),
            "X509_VERIFY_PARAM_set1_host");
    }
  }
  ~TlsStream() noexcept(false) {
    if (ssl_ != nullptr) SSL_free(ssl_);
    OPENSSL_cleanse(secrets_, sizeof(secrets_));
  }

  kj::Promise<void> handshake() {
    ERR_clear_error();
    int r = server_ ? SSL_accept(ssl_) : SSL_connect(ssl_);
    auto sent = flush();
    if (r == 1) {
      established();
      return sent;
    }
    if (SSL_get_error(ssl_, r) != SSL_ERROR_WANT_READ) {
      auto reason = opensslReason("the peer broke off the handshake");
      return sent.then([reason]() -> kj::Promise<void> {
        return KJ_EXCEPTION(FAILED, kj::str("TLS handshake failed: ", reason.c_str()));
      });
    }
    return sent.then([this]() { return fill(); }).then([this](bool more) -> kj::Promise<void> {
      if (!more) return KJ_EXCEPTION(DISCONNECTED, "the peer closed during the TLS handshake");
      return handshake();
    });
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    return kj::evalNow([&]() {
      return readLoop(reinterpret_cast<kj::byte*>(buffer), minBytes, maxBytes, 0);
    });
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    single_ = kj::arrayPtr(reinterpret_cast<const kj::byte*>(buffer), size);
    return write(kj::arrayPtr(&single_, 1));
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    KJ_IF_MAYBE(e, failed_) {
      return kj::cp(*e);
    }
    return kj::evalNow([&]() { return encrypt(Pieces(pieces)); });
  }
  void shutdownWrite() override {
    if (writeKey_.get() != nullptr) {
      static const kj::byte kCloseNotify[] = {1, 0};  // warning, close_notify
      sealControl(ContentType::kAlert, kCloseNotify);
    }
    flush();
    sending_ = sending_.addBranch().then([this]() { inner_->shutdownWrite(); }).fork();
  }
  // abortRead, the socket options and names and whenWriteDisconnected: ForwardingStream.

  // -- the handshake's side (streamBioMethod, keylog) --
  size_t take(kj::byte* out, size_t size) {
    // Ciphertext for OpenSSL to read; 0 when the read buffer is empty.
    size_t n = kj::min(size, readEnd_ - readBegin_);
    memcpy(out, readBuffer_.begin() + readBegin_, n);
    readBegin_ += n;
    if (readBegin_ == readEnd_) readBegin_ = readEnd_ = 0;
    return n;
  }
  void put(const kj::byte* data, size_t size) {
    // Handshake bytes OpenSSL wrote: appended to the write buffer in use, sent by flush().
    if (sealedSize_ + size > sealed_.size()) {
      auto bigger = kj::heapArray<kj::byte>(sealedSize_ + size + kSealCapacity);
      memcpy(bigger.begin(), sealed_.begin(), sealedSize_);
      sealed_ = kj::mv(bigger);
    }
    memcpy(sealed_.begin() + sealedSize_, data, size);
    sealedSize_ += size;
  }
  void secret(kj::StringPtr line) {
    // A line of OpenSSL's key log: "CLIENT_TRAFFIC_SECRET_0 <client random> <secret>", in hex.
    int side;
    if (line.startsWith("CLIENT_TRAFFIC_SECRET_0 ")) {
      side = 0;
    } else if (line.startsWith("SERVER_TRAFFIC_SECRET_0 ")) {
      side = 1;
    } else {
      return;  // the handshake's own secrets: OpenSSL keeps those
    }
    const char* hex = strrchr(line.cStr(), ' ') + 1;
    size_t n = strlen(hex) / 2;
    if (n > sizeof(secrets_[side])) return;  // established() says the secret is missing
    for (size_t i = 0; i < n; ++i) {
      auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
      secrets_[side][i] = static_cast<kj::byte>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
    }
    secretBytes_[side] = n;
  }

 private:
  bool server_;
  uint64_t rekeyEvery_;
  SSL* ssl_ = nullptr;  // until the handshake is done
  kj::byte secrets_[2][64];  // the traffic secrets of the handshake: client's, server's
  size_t secretBytes_[2] = {0, 0};
  kj::Own<TrafficKey> readKey_, writeKey_;  // after the handshake
  kj::Maybe<kj::Exception> failed_;         // the stream broke: every later read or write fails

  kj::Array<kj::byte> readBuffer_;  // ciphertext from the peer, [readBegin_, readEnd_) unread
  size_t readBegin_ = 0, readEnd_ = 0;
  size_t plainBegin_ = 0, plainEnd_ = 0;  // a record opened in place, not yet read
  bool eof_ = false;
  const kj::Executor* opener_ = nullptr;  // the crypto thread of this stream, once it needs one
  kj::Array<kj::byte> spareRead_;         // the other read buffer, for the socket meanwhile
  kj::Array<kj::byte> opening_;           // the read buffer whose records a crypto thread opens

  kj::ArrayPtr<const kj::byte> single_;  // write(buffer, size)'s one piece
  kj::Array<kj::byte> sealed_;           // ciphertext for the peer, not yet handed to inner_
  size_t sealedSize_ = 0;
  std::vector<kj::Array<kj::byte>> spare_;  // sent write buffers, kept for reuse
  const kj::Executor* sealer_ = nullptr;    // the crypto thread sealing this stream's writes
  bool sealing_ = false;                    // it has the write key and buffer now
  bool keyUpdateOwed_ = false;              // the peer asked for a KeyUpdate meanwhile
  kj::ForkedPromise<void> sending_;         // the socket writes so far, in order

  static kj::Array<kj::byte> newSealBuffer() { return kj::heapArray<kj::byte>(kSealCapacity); }

  // The handshake is done: the records are this stream's from here on.
  void established() {
    const SSL_CIPHER* suite = SSL_get_current_cipher(ssl_);
    KJ_REQUIRE(suite != nullptr && TrafficKey::supported(suite),
               "TLS: the handshake agreed a suite troupe does not seal records with");
    KJ_REQUIRE(secretBytes_[0] > 0 && secretBytes_[1] > 0,
               "TLS: OpenSSL did not hand over the traffic secrets");
    KJ_REQUIRE(!SSL_has_pending(ssl_), "TLS: the peer sent records before the handshake ended");
    int mine = server_ ? 1 : 0;
    writeKey_ = kj::heap<TrafficKey>(suite, kj::arrayPtr(secrets_[mine], secretBytes_[mine]));
    readKey_ =
        kj::heap<TrafficKey>(suite, kj::arrayPtr(secrets_[1 - mine], secretBytes_[1 - mine]));
    OPENSSL_cleanse(secrets_, sizeof(secrets_));
    SSL_free(ssl_);  // and its copies of the secrets; nothing of OpenSSL's is needed from here on
    ssl_ = nullptr;
  }

  // Sends what was sealed for the peer, after every earlier send; resolves when it is sent.
  kj::Promise<void> flush() {
    if (sealedSize_ > 0) {
      auto data = kj::mv(sealed_);
      size_t size = sealedSize_;
      if (!spare_.empty()) {
        sealed_ = kj::mv(spare_.back());
        spare_.pop_back();
      } else {
        sealed_ = newSealBuffer();
      }
      sealedSize_ = 0;
      sending_ = sending_.addBranch()
                     .then([this, data = kj::mv(data), size]() mutable {
                       auto sent = inner_->write(data.begin(), size);
                       return sent.then([this, data = kj::mv(data)]() mutable {
                         if (spare_.size() < kSpareBuffers && data.size() == kSealCapacity) {
                           spare_.push_back(kj::mv(data));
                         }
                       });
                     })
                     .fork();
    }
    return sending_.addBranch();
  }

  void answerKeyUpdate() {
    static const kj::byte kKeyUpdate[] = {24, 0, 0, 1, 0};  // KeyUpdate, update_not_requested
    sealControl(ContentType::kHandshake, kKeyUpdate);
    writeKey_->update();
    flush();
  }

  // Seals a record the stream itself sends (an alert, a KeyUpdate) into the write buffer.
  void sealControl(ContentType type, kj::ArrayPtr<const kj::byte> content) {
    sealedSize_ += writeKey_->seal(type, content, sealed_.begin() + sealedSize_);
  }
  void afterSeal() {
    if (writeKey_->records() < rekeyEvery_) return;
    static const kj::byte kKeyUpdate[] = {24, 0, 0, 1, 0};  // KeyUpdate, update_not_requested
    sealControl(ContentType::kHandshake, kKeyUpdate);
    writeKey_->update();
  }

  // Encrypts the rest of `plain`, a record of up to 16 KiB at a time. Whenever kSealBytes are
  // sealed they go to the socket, and sealing goes on into the next buffer once the send before
  // that one is done: the socket writes one buffer while the next is sealed, and at most two wait.
  kj::Promise<void> encrypt(Pieces plain) {
    KJ_REQUIRE(writeKey_.get() != nullptr, "TLS: a write before the handshake ended");
    if (sealedSize_ == 0 && CryptoThreads::sealElsewhere() &&
        plain.sizeUpTo(kSealElsewhereBytes) == kSealElsewhereBytes) {
      return sealElsewhere(plain);
    }
    sealBuffer(plain);
    return sent(plain);
  }

  // Seals records of `plain` into the write buffer until it holds kSealBytes or `plain` ends.
  void sealBuffer(Pieces& plain) {
    while (!plain.empty() && sealedSize_ < kSealBytes) {
      size_t n = plain.sizeUpTo(kMaxPlainBytes);
      sealedSize_ += writeKey_->seal(ContentType::kApplicationData, plain, n,
                                     sealed_.begin() + sealedSize_);
      afterSeal();
    }
  }

  // Sends the write buffer; then, once the send before it is done, goes on with the rest of
  // `plain`, or resolves when the last send is done.
  kj::Promise<void> sent(Pieces plain) {
    if (plain.empty()) return flush();
    auto before = sending_.addBranch();  // every send before this one
    flush();
    return before.then([this, plain]() { return encrypt(plain); });
  }

  // The same as encrypt() with the sealing of a buffer on this stream's crypto thread, while the
  // event loop sends the buffer before: where CPUs are to spare, a stream's sending then costs
  // its event loop the socket's copy and not the cipher's pass too.
  kj::Promise<void> sealElsewhere(Pieces plain) {
    if (sealer_ == nullptr) sealer_ = &CryptoThreads::pick();
    sealing_ = true;
    return sealer_
        ->executeAsync([this, plain]() mutable {
          sealBuffer(plain);  // the write key and buffer are the thread's meanwhile
          return plain;
        })
        .attach(kj::defer([this]() { sealing_ = false; }))  // done, failed or cancelled
        .then([this](Pieces rest) {
          if (keyUpdateOwed_) {
            keyUpdateOwed_ = false;
            answerKeyUpdate();
          }
          return sent(rest);
        });
  }

  // Reads ciphertext from the socket into the read buffer; false at the socket's end.
  kj::Promise<bool> fill() {
    if (readBegin_ == readEnd_) {
      readBegin_ = readEnd_ = 0;
    } else if (readBuffer_.size() - readEnd_ < kMaxRecordBytes) {
      // Too little room left for a whole record: move the part of one that is here to the front.
      memmove(readBuffer_.begin(), readBuffer_.begin() + readBegin_, readEnd_ - readBegin_);
      readEnd_ -= readBegin_;
      readBegin_ = 0;
    }
    return inner_->tryRead(readBuffer_.begin() + readEnd_, 1, readBuffer_.size() - readEnd_)
        .then([this](size_t n) {
          readEnd_ += n;
          return n > 0;
        });
  }

  // What a record of the peer's other than application data asks for.
  void control(ContentType type, kj::ArrayPtr<const kj::byte> content) {
    if (type == ContentType::kAlert && content.size() == 2) {
      if (content[1] == 0) {  // close_notify
        eof_ = true;
        return;
      }
      kj::throwFatalException(kj::Exception(
          kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
          kj::str("TLS: the peer sent the alert \"", SSL_alert_desc_string_long(content[1]),
                  "\" (", content[1], ")")));
    }
    if (type == ContentType::kHandshake) {
      while (content.size() >= 4) {
        size_t length = size_t(content[1]) << 16 | size_t(content[2]) << 8 | content[3];
        if (content.size() < 4 + length) break;
        if (content[0] == 24 && length == 1) {  // KeyUpdate
          readKey_->update();
          if (content[4] == 1) {  // update_requested: answer with our own
            if (sealing_) {
              keyUpdateOwed_ = true;  // once the crypto thread is done with the write key
            } else {
              answerKeyUpdate();
            }
          }
        } else if (content[0] != 4) {  // NewSessionTicket: troupe does not resume sessions
          break;
        }
        content = content.slice(4 + length, content.size());
      }
      if (content.size() == 0) return;
    }
    kj::throwFatalException(kj::Exception(
        kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
        kj::str("TLS: the peer sent a record troupe does not expect after the handshake (type ",
                static_cast<int>(type), ", ", content.size(), " bytes)")));
  }

  kj::Promise<size_t> readLoop(kj::byte* buffer, size_t minBytes, size_t maxBytes, size_t done) {
    KJ_IF_MAYBE(e, failed_) {
      return kj::cp(*e);
    }
    kj::Maybe<Run> elsewhere;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      done = servePlain(buffer, maxBytes, done);
      if (readKey_.get() != nullptr && plainBegin_ == plainEnd_ && !eof_ &&
          maxBytes - done >= kOffloadBytes) {
        auto run = wholeRecords(maxBytes - done);
        if (run.plainRoom >= kOffloadBytes) {
          elsewhere = run;
          return;
        }
      }
      done = openRecords(buffer, maxBytes, done);
    })) {
      failed_ = kj::cp(*e);
      return kj::mv(*e);
    }
    KJ_IF_MAYBE(run, elsewhere) {
      return openElsewhere(buffer, minBytes, maxBytes, done, *run)
          .catch_([this](kj::Exception&& e) -> kj::Promise<size_t> {
            failed_ = kj::cp(e);
            return kj::mv(e);
          });
    }
    if (done >= minBytes || eof_) return done;
    return fill().then([this, buffer, minBytes, maxBytes, done](bool more) -> kj::Promise<size_t> {
      if (!more) {
        eof_ = true;
        return done;
      }
      return readLoop(buffer, minBytes, maxBytes, done);
    });
  }

  size_t servePlain(kj::byte* buffer, size_t maxBytes, size_t done) {
    size_t n = kj::min(maxBytes - done, plainEnd_ - plainBegin_);
    memcpy(buffer + done, readBuffer_.begin() + plainBegin_, n);
    plainBegin_ += n;
    return done + n;
  }

  struct Run {
    size_t end;        // the records [readBegin_, end) of the read buffer
    size_t plainRoom;  // what their plaintext needs at most (the content types and padding too)
    bool wholeAfter;   // a whole record follows, left out for want of room
  };
  // The whole records at the front of the read buffer whose plaintext fits in `room` bytes.
  Run wholeRecords(size_t room) {
    Run run{readBegin_, 0, false};
    while (readEnd_ - run.end >= kHeaderBytes) {
      size_t size = TrafficKey::recordBytes(readBuffer_.begin() + run.end);
      size_t plain = size - kHeaderBytes - kTagBytes;
      if (readEnd_ - run.end < size) break;
      if (run.plainRoom + plain > room) {
        run.wholeAfter = true;
        break;
      }
      run.end += size;
      run.plainRoom += plain;
    }
    return run;
  }

  struct Opened {
    size_t consumed = 0, produced = 0;  // bytes of records opened, of application data
    kj::Maybe<ContentType> control;     // the record the run stopped after, when not data
    size_t controlBytes = 0;            // its content, at `out + produced`
  };
  // Opens `records` into `out` in order, up to and including the first record that is not
  // application data. Runs on a crypto thread, with `key` its own until it returns.
  static Opened openRun(TrafficKey& key, kj::ArrayPtr<const kj::byte> records, kj::byte* out) {
    Opened r;
    while (r.consumed < records.size()) {
      const kj::byte* at = records.begin() + r.consumed;
      size_t size = TrafficKey::recordBytes(at);
      auto opened = key.open(kj::arrayPtr(at, size), out + r.produced);
      r.consumed += size;
      if (opened.type != ContentType::kApplicationData) {
        r.control = opened.type;
        r.controlBytes = opened.bytes;
        break;
      }
      r.produced += opened.bytes;
    }
    return r;
  }

  // Opens `run` into the reader's buffer on this stream's crypto thread; meanwhile the part of a
  // record after the run moves to the other read buffer and, if the reader needs more than the
  // run holds, the socket fills that buffer. Then goes on as readLoop.
  kj::Promise<size_t> openElsewhere(kj::byte* buffer, size_t minBytes, size_t maxBytes,
                                    size_t done, Run run) {
    if (opener_ == nullptr) opener_ = &CryptoThreads::pick();
    if (spareRead_.size() != kStreamReadBytes) {
      spareRead_ = kj::heapArray<kj::byte>(kStreamReadBytes);
    }
    size_t runBegin = readBegin_;
    opening_ = kj::mv(readBuffer_);
    readBuffer_ = kj::mv(spareRead_);
    size_t tail = readEnd_ - run.end;
    memcpy(readBuffer_.begin(), opening_.begin() + run.end, tail);
    readBegin_ = 0;
    readEnd_ = tail;

    auto records = kj::arrayPtr(opening_.begin() + runBegin, run.end - runBegin);
    auto job = opener_->executeAsync([key = readKey_.get(), records, out = buffer + done]() {
      return openRun(*key, records, out);
    });
    // Only bytes the reader is sure to need: the peer may send nothing more until it is answered.
    kj::Promise<kj::Maybe<size_t>> more = kj::Maybe<size_t>(nullptr);
    if (done + run.plainRoom < minBytes && !run.wholeAfter) {
      more = inner_->tryRead(readBuffer_.begin() + readEnd_, 1, readBuffer_.size() - readEnd_)
                 .then([](size_t n) { return kj::Maybe<size_t>(n); });
    }
    return job
        .then([more = kj::mv(more)](Opened opened) mutable {
          return more.then([opened](kj::Maybe<size_t> n) { return std::make_pair(opened, n); });
        })
        .then([this, buffer, minBytes, maxBytes, done, runBegin, run](
                  std::pair<Opened, kj::Maybe<size_t>> result) mutable -> kj::Promise<size_t> {
          auto& [opened, got] = result;
          KJ_IF_MAYBE(n, got) {
            readEnd_ += *n;
            if (*n == 0) eof_ = true;
          }
          size_t left = run.end - runBegin - opened.consumed;
          if (left > 0) {
            // The run stopped at a record that is not data: the records after it go back in
            // front of what the socket gave since (a KeyUpdate, so they need the new key).
            auto joined = kj::heapArray<kj::byte>(kj::max(kStreamReadBytes, left + readEnd_));
            memcpy(joined.begin(), opening_.begin() + run.end - left, left);
            memcpy(joined.begin() + left, readBuffer_.begin(), readEnd_);
            readBuffer_ = kj::mv(joined);
            readEnd_ += left;
          }
          KJ_IF_MAYBE(type, opened.control) {
            control(*type, kj::arrayPtr(buffer + done + opened.produced, opened.controlBytes));
          }
          done += opened.produced;
          if (opening_.size() == kStreamReadBytes) spareRead_ = kj::mv(opening_);
          opening_ = nullptr;
          if (done >= minBytes || eof_) return done;
          return readLoop(buffer, minBytes, maxBytes, done);
        });
  }

  // Hands the reader what is already here: the rest of a record opened in place, then each whole
  // record in the read buffer, opened straight into `buffer` when its plaintext fits there.
  size_t openRecords(kj::byte* buffer, size_t maxBytes, size_t done) {
    KJ_REQUIRE(readKey_.get() != nullptr, "TLS: a read before the handshake ended");
    while (done < maxBytes && !eof_) {
      if (plainBegin_ < plainEnd_) {
        size_t n = kj::min(maxBytes - done, plainEnd_ - plainBegin_);
        memcpy(buffer + done, readBuffer_.begin() + plainBegin_, n);
        plainBegin_ += n;
        done += n;
        continue;
      }
      size_t available = readEnd_ - readBegin_;
      if (available < kHeaderBytes) break;
      kj::byte* at = readBuffer_.begin() + readBegin_;
      size_t size = TrafficKey::recordBytes(at);
      if (available < size) break;
      size_t room = size - kHeaderBytes - kTagBytes;
      bool direct = maxBytes - done >= room;
      kj::byte* out = direct ? buffer + done : at + kHeaderBytes;  // else in place
      auto opened = readKey_->open(kj::arrayPtr(at, size), out);
      readBegin_ += size;
      if (opened.type != ContentType::kApplicationData) {
        control(opened.type, kj::arrayPtr(out, opened.bytes));
      } else if (direct) {
        done += opened.bytes;
      } else {
        plainBegin_ = out - readBuffer_.begin();
        plainEnd_ = plainBegin_ + opened.bytes;
      }
    }
    if (readBegin_ == readEnd_ && plainBegin_ == plainEnd_) readBegin_ = readEnd_ = 0;
    return done;
  }
};

int bioWrite(BIO* bio, const char* data, size_t size, size_t* written) {
  static_cast<TlsStream*>(BIO_get_data(bio))->put(reinterpret_cast<const kj::byte*>(data), size);
  *written = size;
  return 1;
}

int bioRead(BIO* bio, char* out, size_t size, size_t* read) {
  BIO_clear_retry_flags(bio);
  *read = static_cast<TlsStream*>(BIO_get_data(bio))->take(reinterpret_cast<kj::byte*>(out), size);
  if (*read > 0) return 1;
  BIO_set_retry_read(bio);  // nothing buffered: wait for the socket, not EOF
  return 0;
}

long bioControl(BIO*, int command, long, void*) {
  return command == BIO_CTRL_FLUSH ? 1 : 0;  // flush() sends; nothing else applies
}

BIO_METHOD* streamBioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "troupe TLS stream");
    if (m == nullptr || BIO_meth_set_write_ex(m, bioWrite) != 1 ||
        BIO_meth_set_read_ex(m, bioRead) != 1 || BIO_meth_set_ctrl(m, bioControl) != 1) {
      fail("BIO_meth_new");
    }
    return m;
  }();
  return method;
}

kj::Promise<kj::Own<kj::AsyncIoStream>> shake(kj::Own<TlsStream> stream) {
  auto& ref = *stream;
  return kj::evalNow([&]() { return ref.handshake(); })
      .then([stream = kj::mv(stream)]() mutable -> kj::Own<kj::AsyncIoStream> {
        return kj::mv(stream);
      })
      .catch_([](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
        std::string text = e.getDescription().cStr();
        if (isTrustFailure(text.c_str())) {
          auto at = text.find("TLS handshake failed: ");
          if (at != std::string::npos) text = text.substr(at + strlen("TLS handshake failed: "));
          kj::throwFatalException(KJ_EXCEPTION(
              FAILED, kj::str("authentication failed: the peer does not hold this job's secret "
                              "(TLS: ",
                              text.c_str(), ")")));
        }
        kj::throwFatalException(kj::mv(e));
      });
}

}  // namespace

kj::Promise<kj::Own<kj::AsyncIoStream>> handshake(kj::Own<kj::AsyncIoStream> inner, SSL_CTX* ctx,
                                                  bool server, uint64_t rekeyEvery) {
  return shake(kj::heap<TlsStream>(kj::mv(inner), ctx, server, rekeyEvery));
}

void keylog(const SSL* ssl, const char* line) {
  if (auto* stream = static_cast<TlsStream*>(SSL_get_app_data(ssl))) stream->secret(line);
}

}  // namespace troupe::tls
