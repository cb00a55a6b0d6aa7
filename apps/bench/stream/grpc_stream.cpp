// bench_stream_grpc: gRPC's plaintext server stream between two processes, the baseline that
// bench_stream's `grpc` mode runs beside troupe's rows (built where gRPC's C++ packages are
// installed: scripts/install-deps.sh --grpc).
//
//     bench_stream_grpc BATCH_BYTES BATCHES
//
// One Pull call: the server, a child process (the producer), writes BATCHES Batch messages of
// BATCH_BYTES bytes, the same message each time (as bench_stream's raw_tcp writer sends one
// buffer), as fast as gRPC's flow control lets it; this process (the consumer) reads each and
// reads every cache line of it, as bench_stream's consumers do. Prints one JSON object: the
// seconds from the call to the last batch, what arrived, and each process's CPU seconds (user +
// system, every thread: gRPC's own included) over the stream.

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "grpc_stream.grpc.pb.h"

namespace {

double cpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t touch(const std::string& bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += 64) sum += static_cast<unsigned char>(bytes[i]);
  return sum;
}

[[noreturn]] void fail(const std::string& what) {
  fprintf(stderr, "bench_stream_grpc: %s\n", what.c_str());
  exit(1);
}

class Source final : public troupe::bench::Source::Service {
 public:
  explicit Source(int report) : report_(report) {}

  grpc::Status Pull(grpc::ServerContext*, const troupe::bench::PullRequest* request,
                    grpc::ServerWriter<troupe::bench::Batch>* writer) override {
    troupe::bench::Batch batch;
    batch.mutable_data()->assign(request->batch_bytes(), 'x');
    double cpu0 = cpuSeconds();
    for (uint64_t i = 0; i < request->batches(); ++i) {
      if (!writer->Write(batch)) break;
    }
    double cpu = cpuSeconds() - cpu0;
    if (write(report_, &cpu, sizeof(cpu)) != sizeof(cpu)) fail("cannot report the server's CPU");
    return grpc::Status::OK;
  }

 private:
  int report_;
};

// The child: serves Pull on a loopback port, writes the port and then its CPU seconds into
// `report`, and exits once the parent closes `done`.
[[noreturn]] void serve(int report, int done) {
  Source source(report);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&source);
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) fail("the gRPC server did not start");
  if (write(report, &port, sizeof(port)) != sizeof(port)) fail("cannot report the port");
  char c;
  while (read(done, &c, 1) > 0) {
  }
  server->Shutdown();
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: bench_stream_grpc BATCH_BYTES BATCHES");
  uint64_t batchBytes = std::strtoull(argv[1], nullptr, 10);
  uint64_t batches = std::strtoull(argv[2], nullptr, 10);
  if (batchBytes == 0 || batches == 0) fail("BATCH_BYTES and BATCHES must be positive integers");
  int report[2], done[2];
  if (pipe(report) != 0 || pipe(done) != 0) fail("pipe failed");
  // Forked before either side touches gRPC, which does not survive a fork.
  pid_t child = fork();
  if (child < 0) fail("fork failed");
  if (child == 0) {
    close(report[0]);
    close(done[1]);
    serve(report[1], done[0]);
  }
  close(report[1]);
  close(done[0]);
  int port = 0;
  if (read(report[0], &port, sizeof(port)) != sizeof(port)) fail("the server did not start");

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = troupe::bench::Source::NewStub(channel);
  grpc::ClientContext context;
  troupe::bench::PullRequest request;
  request.set_batches(batches);
  request.set_batch_bytes(batchBytes);
  troupe::bench::Batch batch;
  uint64_t got = 0, bytes = 0, sum = 0;
  double start = now(), cpu0 = cpuSeconds();
  auto reader = stub->Pull(&context, request);
  while (reader->Read(&batch)) {
    sum += touch(batch.data());
    bytes += batch.data().size();
    ++got;
  }
  auto status = reader->Finish();
  double seconds = now() - start, consumerCpu = cpuSeconds() - cpu0;
  double producerCpu = -1;
  if (read(report[0], &producerCpu, sizeof(producerCpu)) != sizeof(producerCpu)) {
    fail("the server did not report its CPU");
  }
  close(done[1]);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  if (!status.ok()) fail("the stream failed: " + status.error_message());
  if (got != batches || bytes != batches * batchBytes) {
    fail("the stream lost batches: " + std::to_string(got) + " of " + std::to_string(batches));
  }
  printf(
      "{\"batch_bytes\": %llu, \"batches\": %llu, \"seconds\": %.6f, "
      "\"producer_cpu\": %.6f, \"consumer_cpu\": %.6f, \"checksum\": %llu}\n",
      static_cast<unsigned long long>(batchBytes), static_cast<unsigned long long>(got), seconds,
      producerCpu, consumerCpu, static_cast<unsigned long long>(sum));
  return 0;
}
