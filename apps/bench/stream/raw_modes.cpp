// bench_stream's raw_tcp and raw_tls modes, and the cipher alone: the bounds (bench_stream.h).

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "bench_stream.h"

namespace troupe::bench {

// =============================================================================================
// raw_tcp, raw_tls

transport::Tls& benchTls() {
  static transport::Tls tls("bench_stream: the secret both ends derive their TLS key pair from");
  return tls;
}

// One end of a raw connection: a socket, and a TLS session on it for raw_tls.
struct RawEnd {
  int fd;
  SSL* ssl = nullptr;

  RawEnd(int fd, bool tls, bool server) : fd(fd) {
    if (!tls) return;
    ssl = SSL_new(benchTls().context());
    KJ_ASSERT(ssl != nullptr && SSL_set_fd(ssl, fd) == 1, "SSL_new");
    // Whole socket buffers per read, not a header and a record per syscall.
    SSL_set_read_ahead(ssl, 1);
    SSL_set_default_read_buffer_len(ssl, 1 << 20);
    if (!server) SSL_set_tlsext_host_name(ssl, transport::Tls::peerName());
    int ok = server ? SSL_accept(ssl) : SSL_connect(ssl);
    KJ_ASSERT(ok == 1, "TLS handshake failed", ERR_error_string(ERR_get_error(), nullptr));
  }
  ~RawEnd() {
    if (ssl != nullptr) SSL_free(ssl);
    close(fd);
  }
  ssize_t read(kj::byte* buffer, size_t size) {
    if (ssl == nullptr) return ::read(fd, buffer, size);
    size_t n = 0;
    return SSL_read_ex(ssl, buffer, size, &n) == 1 ? static_cast<ssize_t>(n) : -1;
  }
  ssize_t write(const kj::byte* buffer, size_t size) {
    if (ssl == nullptr) return ::write(fd, buffer, size);
    size_t n = 0;
    return SSL_write_ex(ssl, buffer, kj::min(size, size_t(1) << 20), &n) == 1
               ? static_cast<ssize_t>(n)
               : -1;
  }
};

Result rawStream(uint64_t size, uint32_t batches, bool tls) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  KJ_SYSCALL(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  socklen_t len = sizeof(addr);
  KJ_SYSCALL(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len));
  KJ_SYSCALL(listen(listener, 1));
  int big = 4 << 20;
  uint64_t total = size * batches;
  Result r{tls ? "raw_tls" : "raw_tcp", size, batches};
  std::atomic<double> start{0};
  std::thread reader([&] {
    int fd = accept(listener, nullptr, nullptr);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    RawEnd end(fd, tls, true);
    std::vector<kj::byte> buffer(1 << 20);
    uint64_t got = 0, sum = 0;
    double cpu0 = 0;
    while (got < total) {
      ssize_t n = end.read(buffer.data(), buffer.size());
      if (n <= 0) break;
      if (got == 0) cpu0 = cpuSeconds(RUSAGE_THREAD);  // after the handshake
      sum += touch(kj::arrayPtr(buffer.data(), n));
      got += n;
    }
    r.seconds = now() - start;
    r.consumerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    KJ_ASSERT(got == total, "raw stream lost bytes", r.mode, got, total, sum);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  KJ_SYSCALL(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  {
    RawEnd end(fd, tls, false);
    std::vector<kj::byte> batch(size, 'x');
    start = now();
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    for (uint32_t b = 0; b < batches; ++b) {
      for (size_t off = 0; off < size;) {
        ssize_t n = end.write(batch.data() + off, size - off);
        KJ_ASSERT(n > 0, "raw write failed", r.mode, strerror(errno));
        off += n;
      }
    }
    r.producerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    reader.join();
  }
  close(listener);
  return r;
}


// =============================================================================================
// The cipher alone: the bound's other half


// The suite a handshake between two ends of benchTls() agrees on (over a BIO pair, in memory).
std::string negotiatedSuite() {
  SSL* client = SSL_new(benchTls().context());
  SSL* server = SSL_new(benchTls().context());
  KJ_ASSERT(client != nullptr && server != nullptr, "SSL_new");
  BIO *a = nullptr, *b = nullptr;
  KJ_ASSERT(BIO_new_bio_pair(&a, 0, &b, 0) == 1, "BIO_new_bio_pair");
  SSL_set_bio(client, a, a);
  SSL_set_bio(server, b, b);
  SSL_set_tlsext_host_name(client, transport::Tls::peerName());
  SSL_set_connect_state(client);
  SSL_set_accept_state(server);
  for (int turn = 0; turn < 20 && !(SSL_is_init_finished(client) && SSL_is_init_finished(server));
       ++turn) {
    SSL_do_handshake(client);
    SSL_do_handshake(server);
  }
  KJ_ASSERT(SSL_is_init_finished(client), "the in-memory handshake did not finish");
  std::string suite = SSL_CIPHER_standard_name(SSL_get_current_cipher(client));
  SSL_free(client);
  SSL_free(server);
  return suite;
}

const EVP_CIPHER* aeadOf(const std::string& suite) {
  if (suite == "TLS_AES_128_GCM_SHA256") return EVP_aes_128_gcm();
  if (suite == "TLS_AES_256_GCM_SHA384") return EVP_aes_256_gcm();
  if (suite == "TLS_CHACHA20_POLY1305_SHA256") return EVP_chacha20_poly1305();
  KJ_FAIL_REQUIRE("a suite bench_stream does not know", suite);
}

// Seals 256 MiB of plaintext as records of `recordBytes` (a nonce per record, the 5-byte header
// as associated data, the tag after the ciphertext, out of place as a sender fills its socket
// buffer), then opens them again; CPU time of this thread per MB for each.
CipherCost measureCipher() {
  CipherCost c;
  c.suite = negotiatedSuite();
  const EVP_CIPHER* cipher = aeadOf(c.suite);
  constexpr size_t kBuffer = 4 << 20, kRounds = 64;
  size_t records = kBuffer / c.recordBytes, sealedBytes = c.recordBytes + 5 + 1 + 16;
  std::vector<kj::byte> plain(kBuffer + 64, 'x'), sealed(records * sealedBytes);
  kj::byte key[32] = {1}, iv[12] = {2}, header[5] = {23, 3, 3, 0, 0};
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  KJ_ASSERT(EVP_CipherInit_ex(ctx, cipher, nullptr, key, iv, 1) == 1, "EVP_CipherInit_ex");
  int n = 0;
  for (bool seal : {true, false}) {
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    for (size_t round = 0; round < kRounds; ++round) {
      for (size_t r = 0; r < records; ++r) {
        iv[11] = static_cast<kj::byte>(r);  // a new nonce per record, as the sequence number is
        kj::byte* record = sealed.data() + r * sealedBytes;
        kj::byte* text = plain.data() + r * c.recordBytes;
        kj::byte* tag = record + sealedBytes - 16;
        KJ_ASSERT(EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, iv, seal) == 1);
        EVP_CipherUpdate(ctx, nullptr, &n, header, sizeof(header));
        if (seal) {
          EVP_CipherUpdate(ctx, record, &n, text, c.recordBytes + 1);  // + the content type
          KJ_ASSERT(EVP_CipherFinal_ex(ctx, tag, &n) == 1);
          EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag);
        } else {
          EVP_CipherUpdate(ctx, text, &n, record, c.recordBytes + 1);
          EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag);
          KJ_ASSERT(EVP_CipherFinal_ex(ctx, text + c.recordBytes + 1, &n) == 1,
                    "a record failed to open", r);
        }
      }
    }
    double us = (cpuSeconds(RUSAGE_THREAD) - cpu0) * 1e6 / (kRounds * records * c.recordBytes / 1e6);
    (seal ? c.sealUsPerMb : c.openUsPerMb) = us;
  }
  EVP_CIPHER_CTX_free(ctx);
  return c;
}

}  // namespace troupe::bench
