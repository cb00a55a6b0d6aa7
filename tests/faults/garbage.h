// Connections a stranger opens to a node's port: what a port scanner, a health checker or a
// confused client sends. A node must drop them and go on with the job.

#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace faults {

class Garbage {
 public:
  Garbage(std::string address, uint64_t seed);
  // `address` is HOST:PORT as `troupe sim` prints it.
  ~Garbage();
  Garbage(const Garbage&) = delete;

  void randomBytes(int connections, size_t bytes);
  // Each connection writes `bytes` random bytes and closes.
  void halfOpen(int connections);
  // Connections that never send a byte; they stay open until this object goes.
  void hugeLengthPrefix();
  // A Cap'n Proto frame header announcing one segment of 2^30 words (8 GiB), a little of it,
  // then silence; stays open.
  void hugeSegmentCount();
  // A frame header announcing 2^28 segments; stays open.
  std::vector<std::string> takeFailures();
  // Connections that could not be opened since the last call, in words: each is a stranger that
  // never reached the node, so the case proved less than it says.

 private:
  int connect();
  // A connected socket, or -1 (the node may already be gone: that is the case's verdict, not
  // the injector's).
  void send(int fd, const std::vector<uint8_t>& bytes);

  std::string host_;
  int port_ = 0;
  std::mt19937_64 rng_;
  std::vector<int> open_;
  std::vector<std::string> failures_;
};

}  // namespace faults
