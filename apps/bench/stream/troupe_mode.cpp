// bench_stream's troupe modes and grpc's child (bench_stream.h).

#include <sys/resource.h>
#include <unistd.h>

#include <limits.h>

#include "troupe/process.h"
#include "troupe/troupe.h"

#include "bench_stream.h"

namespace troupe::bench {

// =============================================================================================
// troupe, troupe_insecure: the actors, the driver, and running them under `troupe sim`

class ProducerActor final : public ActorBase<Producer> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> produce(ProduceContext context) override {
    auto p = context.getParams();
    credits_ = p.getCredits();
    auto batch = SendBuffer::allocate(p.getBatchBytes());
    memset(batch.bytes().begin(), 'x', batch.size());
    batch_ = kj::mv(batch);
    mayPush_ = [this]() -> kj::Promise<void> {
      if (credits_ > 0) {
        --credits_;
        return kj::READY_NOW;
      }
      auto paf = kj::newPromiseAndFulfiller<void>();
      waiting_ = kj::mv(paf.fulfiller);
      return paf.promise.then([this]() { --credits_; });
    };
    double cpu0 = cpuSeconds(RUSAGE_SELF);
    return pushAll(p.getSink(), batch_, p.getBatches(), mayPush_).then([context, cpu0]() mutable {
      context.getResults().setCpuSeconds(cpuSeconds(RUSAGE_SELF) - cpu0);
    });
  }

  kj::Promise<void> grant(GrantContext context) override {
    credits_ += context.getParams().getCredits();
    KJ_IF_MAYBE(w, waiting_) {
      auto fulfiller = kj::mv(*w);
      waiting_ = nullptr;
      fulfiller->fulfill();
    }
    return kj::READY_NOW;
  }

 private:
  uint32_t credits_ = 0;
  BatchBytes batch_;  // lent to every push
  kj::Function<kj::Promise<void>()> mayPush_;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiting_;
};

class ConsumerActor final : public ActorBase<Consumer> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> pull(PullContext context) override {
    auto p = context.getParams();
    auto addresses = p.getProducers();
    uint32_t each = p.getBatches() / addresses.size();
    uint64_t size = p.getBatchBytes();
    // Per producer: its produce() call's answer, then every batch it sent arrived. The answer
    // first, so that a call that failed is reported with its own reason, not as the sink it
    // released early.
    auto producersDone = kj::heapArrayBuilder<kj::Promise<double>>(addresses.size());
    double start = now(), cpu0 = cpuSeconds(RUSAGE_SELF), loop0 = cpuSeconds(RUSAGE_THREAD);
    for (auto address : addresses) {
      auto producer = this->context().resolve<Producer>(ActorAddress::fromProto(address));
      auto sink = kj::heap<SinkServer>(each, [producer]() mutable {
        auto grant = producer.grantRequest();
        grant.setCredits(1);
        grant.send().detach([](kj::Exception&&) {});
      });
      auto arrived = sink->whenAll();
      auto request = producer.produceRequest();
      request.setSink(kj::mv(sink));
      request.setBatches(each);
      request.setBatchBytes(size);
      request.setCredits(p.getCredits());
      producersDone.add(request.send().then([arrived = kj::mv(arrived)](auto r) mutable {
        double cpu = r.getCpuSeconds();
        return arrived.then([cpu]() { return cpu; });
      }));
    }
    uint64_t batches = uint64_t(each) * addresses.size();
    return kj::joinPromises(producersDone.finish())
        .then([context, start, cpu0, loop0, batches, size](kj::Array<double> cpus) mutable {
          auto f = context.getResults().initFigures();
          f.setSeconds(now() - start);
          f.setConsumerCpuSeconds(cpuSeconds(RUSAGE_SELF) - cpu0);
          f.setConsumerLoopCpuSeconds(cpuSeconds(RUSAGE_THREAD) - loop0);
          double producers = 0;
          for (double c : cpus) producers += c;
          f.setProducerCpuSeconds(producers);
          f.setBatches(batches);
          f.setBytes(batches * size);
        });
  }
};

kj::Promise<void> measureSizes(Driver& job, std::shared_ptr<std::vector<Ref<Producer>>> producers,
                               Ref<Consumer> consumer,
                               std::shared_ptr<Options> options, size_t index,
                               std::shared_ptr<nlohmann::json> out) {
  if (index == options->sizes.size()) {
    printf("%s%s\n", kFiguresMarker, out->dump().c_str());
    fflush(stdout);
    return kj::READY_NOW;
  }
  uint64_t size = options->sizes[index];
  auto pull = consumer.pullRequest();
  auto addresses = pull.initProducers(producers->size());
  for (size_t i = 0; i < producers->size(); ++i) (*producers)[i].address().toProto(addresses[i]);
  pull.setBatches(options->batchesFor(size));
  pull.setBatchBytes(size);
  pull.setCredits(options->credits);
  return pull.send().then([=, &job](auto response) mutable {
    auto f = response.getFigures();
    out->push_back({{"batch_bytes", size},
                    {"batches", f.getBatches()},
                    {"seconds", f.getSeconds()},
                    {"producer_cpu", f.getProducerCpuSeconds()},
                    {"consumer_cpu", f.getConsumerCpuSeconds()},
                    {"consumer_loop_cpu", f.getConsumerLoopCpuSeconds()}});
    return measureSizes(job, producers, consumer, options, index + 1, out);
  });
}

kj::Promise<void> drive(Driver& job) {
  auto& args = job.args();
  auto flag = std::find(args.begin(), args.end(), kNodeFlag);
  KJ_REQUIRE(flag != args.end() && flag + 1 != args.end(), "no options after --troupe-node");
  auto options = std::make_shared<Options>(fromJson(nlohmann::json::parse(*(flag + 1))));
  auto producers = std::make_shared<std::vector<Ref<Producer>>>();  // one on each node of a
  for (auto& p : job.spawnEach<Producer>(Placement::group("a"))) producers->push_back(kj::mv(p));
  auto consumer = job.spawn<Consumer>(Placement::group("b"));
  return measureSizes(job, producers, consumer, options, 0,
                      std::make_shared<nlohmann::json>(nlohmann::json::array()));
}

std::string selfPath() {
  char path[PATH_MAX];
  ssize_t n;
  KJ_SYSCALL(n = readlink("/proc/self/exe", path, sizeof(path) - 1));
  return std::string(path, n);
}

std::vector<Result> runTroupe(Options options, const std::string& mode) {
  bool insecure = mode == "troupe_insecure";
  options.producers = mode == "troupe_x2" ? 2 : 1;
  KJ_REQUIRE(
      access(options.troupeBinary.c_str(), X_OK) == 0,
      "the troupe modes need the troupe binary (build the `troupe` target, or pass --troupe)",
      options.troupeBinary);
  EventLoop loop(1);
  ChildProcess::Options child;
  child.args = {options.troupeBinary, "sim"};
  if (insecure) {  // --env first: it takes every value up to the next flag
    for (auto env : {"a:TROUPE_INSECURE=1", "b:TROUPE_INSECURE=1"}) {
      child.args.push_back("--env");
      child.args.push_back(env);
    }
  }
  // The largest batch must fit in a message, with room for the call around it.
  uint64_t largest = *std::max_element(options.sizes.begin(), options.sizes.end());
  auto maxMessage = std::to_string(std::max<uint64_t>(64ull << 20, largest + (1 << 20)));
  for (auto arg : {std::string("--group"), "a=" + std::to_string(options.producers),
                   std::string("--group"), std::string("b=1"), std::string("--head-group"),
                   std::string("a"), std::string("--cpu-scale"), options.cpuScale}) {
    child.args.push_back(arg);
  }
  for (auto& arg :
       {selfPath(), std::string(kNodeFlag), toJson(options).dump(), std::string("--log-level"),
        std::string("warn"), std::string("--max-message-bytes"), maxMessage}) {
    child.args.push_back(arg);
  }
  std::string figures, output;
  child.onLine = [&](kj::StringPtr line, bool) {
    std::string text = line.cStr();
    auto at = text.find(kFiguresMarker);
    if (at != std::string::npos) figures = text.substr(at + strlen(kFiguresMarker));
    output += text + "\n";
  };
  ChildProcess sim(loop, kj::mv(child));
  auto exit = sim.onExit().wait(loop.waitScope());
  KJ_REQUIRE(exit.status == 0 && exit.signal == 0 && !figures.empty(), "the troupe cluster failed",
             exit.status, exit.signal, output);
  std::vector<Result> results;
  for (auto& f : nlohmann::json::parse(figures)) {
    Result r{mode, f.at("batch_bytes").get<uint64_t>(),
             f.at("batches").get<uint64_t>()};
    r.seconds = f.at("seconds").get<double>();
    r.producerCpu = f.at("producer_cpu").get<double>();
    r.consumerCpu = f.at("consumer_cpu").get<double>();
    r.consumerLoopCpu = f.at("consumer_loop_cpu").get<double>();
    results.push_back(r);
  }
  return results;
}

// grpc: bench_stream_grpc, one run per batch size; it prints one JSON object.
Result runGrpc(const Options& options, uint64_t size, uint32_t batches) {
  EventLoop loop(1);
  ChildProcess::Options child;
  child.args = {options.grpcBinary, std::to_string(size), std::to_string(batches)};
  std::string figures, output;
  child.onLine = [&](kj::StringPtr line, bool) {
    std::string text = line.cStr();
    if (!text.empty() && text[0] == '{') figures = text;
    output += text + "\n";
  };
  ChildProcess grpc(loop, kj::mv(child));
  auto exit = grpc.onExit().wait(loop.waitScope());
  KJ_REQUIRE(exit.status == 0 && exit.signal == 0 && !figures.empty(), "the gRPC stream failed",
             exit.status, exit.signal, output);
  auto f = nlohmann::json::parse(figures);
  Result r{"grpc", size, f.at("batches").get<uint64_t>()};
  r.seconds = f.at("seconds").get<double>();
  r.producerCpu = f.at("producer_cpu").get<double>();
  r.consumerCpu = f.at("consumer_cpu").get<double>();
  return r;
}

int runTroupeNode(int argc, char** argv) {
  Registry types;
  types.add<ProducerActor>();  // "stream.Producer"
  types.add<ConsumerActor>();  // "stream.Consumer"
  return troupe::run(argc, argv, types, drive);
}

}  // namespace troupe::bench
