// Places for connections that have not logged in yet (--max-unauthenticated), counted in total
// and per peer address. One address holds at most three quarters of them: strangers on one
// address cannot take the places a node needs to rejoin from its own (docs/security.md). The
// node's gate and the head's control path each keep one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <kj/async-io.h>
#include <kj/memory.h>

#include <algorithm>
#include <map>
#include <string>

namespace troupe {

// "10.0.0.5:41234": an accepted connection's peer, as the places count it and logs name it.
inline std::string peerName(kj::AsyncIoStream& stream) {
  struct sockaddr_storage addr;
  kj::uint len = sizeof(addr);
  try {
    stream.getpeername(reinterpret_cast<struct sockaddr*>(&addr), &len);
    char host[64] = "?";
    if (addr.ss_family == AF_INET) {
      auto* in = reinterpret_cast<struct sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
    }
  } catch (...) {
  }
  return "unknown peer";
}

class LoginPlaces {
 public:
  explicit LoginPlaces(unsigned limit) : limit_(std::max(1u, limit)) {}
  KJ_DISALLOW_COPY(LoginPlaces);

  unsigned limit() const { return limit_; }
  unsigned perAddress() const { return std::max(1u, limit_ - limit_ / 4); }
  unsigned held() const { return held_; }

  // One connection's place, given back when it logs in (release()) or ends.
  class Place {
   public:
    Place(LoginPlaces& places, std::string address) : places_(places), address_(kj::mv(address)) {
      ++places_.held_;
      ++places_.byAddress_[address_];
    }
    ~Place() { release(); }
    KJ_DISALLOW_COPY(Place);
    void release() {
      if (!held_) return;
      held_ = false;
      --places_.held_;
      auto it = places_.byAddress_.find(address_);
      if (--it->second == 0) places_.byAddress_.erase(it);
    }

   private:
    LoginPlaces& places_;
    std::string address_;
    bool held_ = true;
  };

  // A place for a connection from `peer` ("10.0.0.5:41234", or any text without a port), or
  // null with why there is none in `why`.
  kj::Own<Place> take(const std::string& peer, std::string& why) {
    auto colon = peer.rfind(':');
    auto address = colon == std::string::npos ? peer : peer.substr(0, colon);
    if (held_ >= limit_) {
      why = std::to_string(held_) + " connections have not logged in yet (--max-unauthenticated)";
      return kj::Own<Place>();
    }
    auto it = byAddress_.find(address);
    if (it != byAddress_.end() && it->second >= perAddress()) {
      why = std::to_string(it->second) + " connections from " + address +
            " have not logged in yet (--max-unauthenticated: one address holds at most " +
            std::to_string(perAddress()) + " of its " + std::to_string(limit_) +
            " places; the rest are kept for others)";
      return kj::Own<Place>();
    }
    return kj::heap<Place>(*this, address);
  }

 private:
  unsigned limit_;
  unsigned held_ = 0;
  std::map<std::string, unsigned> byAddress_;
};

}  // namespace troupe
