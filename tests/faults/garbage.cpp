#include "garbage.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace faults {

Garbage::Garbage(std::string address, uint64_t seed) : rng_(seed) {
  auto colon = address.rfind(':');
  host_ = address.substr(0, colon);
  port_ = std::stoi(address.substr(colon + 1));
}

Garbage::~Garbage() {
  for (int fd : open_) close(fd);
}

int Garbage::connect() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // A node that stops reading must not stall the injector (and with it the case's clock).
  timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port_);
  if (inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    failures_.push_back("connect to " + host_ + ":" + std::to_string(port_) + ": " +
                        strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

std::vector<std::string> Garbage::takeFailures() {
  return std::exchange(failures_, {});
}

void Garbage::send(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    auto n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the node closed it, as it may
    done += n;
  }
}

void Garbage::randomBytes(int connections, size_t bytes) {
  for (int i = 0; i < connections; ++i) {
    int fd = connect();
    if (fd < 0) continue;
    std::vector<uint8_t> data(bytes);
    for (auto& b : data) b = static_cast<uint8_t>(rng_());
    send(fd, data);
    close(fd);
  }
}

void Garbage::halfOpen(int connections) {
  for (int i = 0; i < connections; ++i) {
    int fd = connect();
    if (fd >= 0) open_.push_back(fd);
  }
}

namespace {

std::vector<uint8_t> words(std::initializer_list<uint32_t> values, size_t zeros) {
  std::vector<uint8_t> out;
  for (uint32_t v : values) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));  // little end
  }
  out.resize(out.size() + zeros, 0);
  return out;
}

}  // namespace

void Garbage::hugeLengthPrefix() {
  int fd = connect();
  if (fd < 0) return;
  // Segment count - 1 = 0, then segment 0's size in words.
  send(fd, words({0, 1u << 30}, 4096));
  open_.push_back(fd);
}

void Garbage::hugeSegmentCount() {
  int fd = connect();
  if (fd < 0) return;
  send(fd, words({(1u << 28) - 1, 16, 16, 16}, 256));
  open_.push_back(fd);
}

}  // namespace faults
