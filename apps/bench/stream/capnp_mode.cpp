// bench_stream's capnp and capnp_tls modes (bench_stream.h).

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>

#include <future>
#include <thread>

#include "troupe/transport.h"

#include "bench_stream.h"

namespace troupe::bench {

kj::Promise<void> pushAll(Sink::Client sink, const BatchBytes& batch, uint32_t left,
                          kj::Function<kj::Promise<void>()>& mayPush) {
  if (left == 0) return kj::READY_NOW;
  return mayPush().then([sink, &batch, left, &mayPush]() mutable {
    auto request = sink.pushRequest();
    KJ_SWITCH_ONEOF(batch) {
      KJ_CASE_ONEOF(lent, SendBuffer) {
        request.adoptBatch(lent.lend(request));
      }
      KJ_CASE_ONEOF(pattern, kj::ArrayPtr<const kj::byte>) {
        memcpy(request.initBatch(pattern.size()).begin(), pattern.begin(), pattern.size());
      }
    }
    return request.send().then([sink, &batch, left, &mayPush]() mutable {
      return pushAll(kj::mv(sink), batch, left - 1, mayPush);
    });
  });
}


kj::Own<kj::AsyncIoStream> transport(kj::Own<kj::AsyncIoStream> socket, bool tls, bool server,
                                     kj::WaitScope& waitScope) {
  if (!tls) return socket;
  auto secure =
      server ? benchTls().wrapServer(kj::mv(socket)) : benchTls().wrapClient(kj::mv(socket));
  return transport::coalesce(secure.wait(waitScope));
}

Result capnpStream(uint64_t size, uint32_t batches, bool tls) {
  Result r{tls ? "capnp_tls" : "capnp", size, batches};
  capnp::ReaderOptions reader;
  reader.traversalLimitInWords = (size + (1 << 20)) / 8 + (1 << 20);
  std::promise<int> port;
  std::thread server([&]() {
    auto io = kj::setupAsyncIo();
    auto listener =
        io.provider->getNetwork().parseAddress("127.0.0.1", 0).wait(io.waitScope)->listen();
    port.set_value(listener->getPort());
    auto stream = transport(listener->accept().wait(io.waitScope), tls, true, io.waitScope);
    auto sink = kj::heap<SinkServer>(batches);
    auto& counted = *sink;
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::SERVER, reader);
    auto rpc = capnp::makeRpcServer(network, kj::mv(sink));
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    counted.whenAll().wait(io.waitScope);
    r.consumerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    network.onDisconnect().wait(io.waitScope);
  });
  {
    auto io = kj::setupAsyncIo();
    auto address = io.provider->getNetwork()
                       .parseAddress("127.0.0.1", port.get_future().get())
                       .wait(io.waitScope);
    auto stream = transport(address->connect().wait(io.waitScope), tls, false, io.waitScope);
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::CLIENT, reader);
    auto rpc = capnp::makeRpcClient(network);
    capnp::MallocMessageBuilder vat;
    auto id = vat.initRoot<capnp::rpc::twoparty::VatId>();
    id.setSide(capnp::rpc::twoparty::Side::SERVER);
    auto sink = rpc.bootstrap(id).castAs<Sink>();
    std::vector<kj::byte> pattern(size, 'x');
    BatchBytes batch = kj::arrayPtr(pattern.data(), size).asConst();
    kj::Function<kj::Promise<void>()> always = [] { return kj::Promise<void>(kj::READY_NOW); };
    double start = now();
    double cpu0 = cpuSeconds(RUSAGE_THREAD);
    pushAll(sink, batch, batches, always).wait(io.waitScope);
    auto done = sink.doneRequest().send().wait(io.waitScope);
    r.seconds = now() - start;
    r.producerCpu = cpuSeconds(RUSAGE_THREAD) - cpu0;
    KJ_ASSERT(done.getBatches() == batches && done.getBytes() == size * batches,
              "the sink did not get every batch", done.getBatches(), done.getBytes());
  }
  server.join();
  return r;
}

}  // namespace troupe::bench
