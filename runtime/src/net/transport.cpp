// troupe/transport.h, the transport's face for code that measures it: JobTls and CoalescingStream
// behind names of their own.

#include "troupe/transport.h"

#include <string>

#include "coalescing_stream.h"
#include "secure.h"

namespace troupe::transport {

Tls::Tls(kj::StringPtr secret) : tls(kj::heap<JobTls>(std::string(secret.cStr()))) {}

Tls::~Tls() noexcept(false) {}

kj::Promise<kj::Own<kj::AsyncIoStream>> Tls::wrapServer(kj::Own<kj::AsyncIoStream> stream) {
  return tls->wrapServer(kj::mv(stream));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Tls::wrapClient(kj::Own<kj::AsyncIoStream> stream) {
  return tls->wrapClient(kj::mv(stream));
}

ssl_ctx_st* Tls::context() const {
  return tls->context();
}

const char* Tls::peerName() {
  return JobTls::kPeerName;
}

kj::Own<kj::AsyncIoStream> coalesce(kj::Own<kj::AsyncIoStream> stream) {
  return kj::heap<CoalescingStream>(kj::mv(stream));
}

void setNoDelay(kj::AsyncIoStream& stream) {
  troupe::setNoDelay(stream);
}

}  // namespace troupe::transport
