#include "job.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "augmenter_actor.h"
#include "augmenter_spawn.h"
#include "train.capnp.h"
#include "trainer_actor.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/epoch.h"
#include "troupe/loop.h"
#include "troupe/troupe.h"

namespace troupe::python {
namespace {

using troupe::train::ScriptLearner;

std::unique_ptr<Feed> theFeed;

class Job {
  // The process's troupe job: the runtime's thread and what the script waits on.
 public:
  static Job& get() {
    static Job* job = new Job;  // never destroyed: the runtime ends the process with _exit
    return *job;
  }

  // Starts the runtime; blocks (without the GIL) until this process is the head and its driver
  // runs, which on any other instance is never.
  void start(std::vector<std::string> argv, Settings settings) {
    {
      std::lock_guard lock(mutex_);
      if (started_) throw std::runtime_error("troupe.data: one stream per process");
      started_ = true;
    }
    settings_ = std::move(settings);
    if (!settings_.dataset.empty()) open();
    learner_ = ScriptLearner::create();
    setFeed(learnerFeed(learner_));
    argv_ = std::move(argv);
    for (auto& a : argv_) args_.push_back(a.data());
    args_.push_back(nullptr);
    types_.add<troupe::train::AugmenterActor>();
    types_.add<troupe::train::TrainerActor>();
    std::thread([this]() {
      troupe::run(static_cast<int>(argv_.size()), args_.data(), types_,
                  [this](troupe::Driver& job) { return drive(job); });
    }).detach();
    // A trainer attached to this process's learner: it trains (the head is rank 0, other ranks
    // are the training group's other instances). On a data instance that is never.
    if (learner_->waitAttached().rank == 0) {
      std::unique_lock lock(mutex_);
      running_.wait(lock, [this] { return driving_; });
    }
  }

  std::shared_ptr<ScriptLearner> learner() const { return learner_; }
  const Format& format() const { return format_; }
  std::string placements() const {
    std::lock_guard lock(mutex_);
    return placements_;
  }

 private:
  // The dataset, opened on every instance before the runtime starts (the file list is shared
  // with this process's augmenters), and the transform parsed against it: what cannot be used
  // raises in the script, naming it (SourceError, SpecError: RuntimeError, ValueError).
  void open() {
    auto& s = settings_;
    format_.source = troupe::train::sharedSource(s.dataset);
    if (s.transform.empty())
      s.transform = "RandomResizedCrop(224),RandomHorizontalFlip(),Normalize(imagenet)";
    auto pipeline = troupe::images::Pipeline::parse(s.transform);
    bool grey = format_.source->encoding() == troupe::data::Encoding::kRawGrey8;
    format_.shape = pipeline.outputShape(grey ? 1 : 3);
    format_.dtype = pipeline.dtype();
    format_.classes = uint32_t(format_.source->classes().size());
  }

  kj::Promise<void> drive(troupe::Driver& job) {
    // The dataset's size, on the pool (unpacking it on the event loop starves heartbeats).
    return job.loop()
        .offload([dir = settings_.dataDir, source = format_.source, python = settings_.python,
                  samples = settings_.samples]() -> size_t {
          if (python) return samples;
          if (source) return source->size();
          return troupe::data::loadFashionMnist(dir, troupe::data::Split::kTrain).size();
        })
        .then([this, &job](size_t available) { return place(job, available); });
  }

  // The ranks of a DDP job: the head's group's instances at the start, the head's first, the
  // others by host name; on each, TROUPE_PROCS_PER_HOST processes (troupe_procs_per_host; unset:
  // one per GPU of the instance, at least one), local rank 0 the instance's troupe process. One
  // rank (the head) unless the epoch is cut as torch's DataLoader cuts it (DataLoader, or a
  // dataset), which a rank's share needs.
  struct RankPlace {
    std::string host;
    uint32_t localRank = 0, localRanks = 1;
  };
  std::vector<RankPlace> rankPlaces(troupe::Driver& job, bool batched) const {
    std::string head = job.node().host().cStr();
    std::vector<std::pair<std::string, uint32_t>> hosts{{head, job.node().gpus()}};
    if (batched) {
      std::vector<std::pair<std::string, uint32_t>> others;
      for (auto& n : job.nodes()) {
        if (n.group() == job.node().group() && n.host() != head.c_str()) {
          others.push_back({n.host().cStr(), n.gpus()});
        }
      }
      std::sort(others.begin(), others.end());
      hosts.insert(hosts.end(), others.begin(), others.end());
    }
    uint32_t procs = 0;  // per host, as the environment says; 0: the host's GPUs
    if (const char* given = getenv("TROUPE_PROCS_PER_HOST"); given != nullptr && *given) {
      char* end = nullptr;
      auto v = strtoul(given, &end, 10);
      KJ_REQUIRE(*end == '\0' && v >= 1 && v <= 1024,
                 "TROUPE_PROCS_PER_HOST (troupe_procs_per_host) must be a number of processes "
                 "per instance, 1 to 1024",
                 given);
      procs = uint32_t(v);
    }
    std::vector<RankPlace> out;
    for (auto& [host, gpus] : hosts) {
      uint32_t local = batched ? (procs ? procs : std::max<uint32_t>(gpus, 1)) : 1;
      for (uint32_t k = 0; k < local; ++k) out.push_back({host, k, local});
    }
    return out;
  }

  kj::Promise<void> place(troupe::Driver& job, size_t available) {
    auto& s = settings_;
    KJ_REQUIRE(s.samples <= available, "train_samples is larger than the training set", s.samples,
               available);
    samples_ = s.samples ? s.samples : available;
    auto augment = s.augment == "light" ? troupe::augment::AugmentConfig::light()
                                        : troupe::augment::AugmentConfig::heavy();
    if (s.blur >= 0) augment.blurKernel = s.blur;
    augment.validate();
    auto spec = troupe::train::augmenterSpecOf(s, samples_, augment,
                                               format_.source != nullptr || s.python);
    spec.python = s.python;
    spec.shuffle = s.shuffle;
    auto augmenters =
        job.spawnMany<hetero::Augmenter>(troupe::train::augmenterPlacement(spec),
                                         troupe::train::augmenterOptions(spec, "augmenter"));
    // A trainer per rank, in its script's process: rank 0's here, the others' on the training
    // group's other instances; their batches go to their scripts.
    auto places = rankPlaces(job, spec.batched);
    auto ranks = static_cast<uint32_t>(places.size());
    std::string masterAddr = hostOf(job.node().address().cStr());
    uint16_t masterPort = freePort();  // one rank too: torchrun sets it for one process
    std::vector<troupe::Ref<hetero::Trainer>> trainers;
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      trainers.push_back(job.spawn<hetero::Trainer>(
          troupe::Placement::any().labels("host=" + places[rank].host),
          troupe::SpawnOptions()
              .named(rank == 0 ? std::string("trainer") : "trainer-" + std::to_string(rank))
              .args<hetero::TrainerArgs>([&](auto a) {
                a.setBatchSize(s.batchSize);
                a.setSeed(s.seed);
                a.setPrefetch(s.prefetch);
                a.setSamplesSetting(s.samples);
                // The instance's troupe process's first learner; a local rank's, 1 + that rank.
                a.setScript(learner_->id() + places[rank].localRank);
                if (s.python) {
                  a.setPython(true);
                } else if (format_.source) {
                  troupe::train::setSampleFormat(a.initSample(), format_.shape, format_.dtype,
                                                 format_.classes);
                }
                if (spec.batched) {
                  troupe::train::setBatchedOrder(a.initOrder(), s.shuffle, s.dropLast, rank,
                                                 ranks, s.inOrder);
                }
                auto ddp = a.initDdp();
                ddp.setMasterAddr(masterAddr);
                ddp.setMasterPort(masterPort);
                ddp.setLocalRank(places[rank].localRank);
                ddp.setLocalRanks(places[rank].localRanks);
              })
              // Stopped early (SIGTERM), it waits for the script to save its state and end.
              .stopTimeout(static_cast<int64_t>(s.stopTimeoutSeconds) * kj::SECONDS)));
    }
    std::string table = "actor          type             host     group\n";
    auto row = [&](const troupe::ActorAddress& a, const char* type) {
      char line[160];
      snprintf(line, sizeof line, "%-14s %-16s %-8s %s\n", a.name.c_str(), type, a.host.c_str(),
               a.group.c_str());
      table += line;
    };
    for (auto& t : trainers) row(t.address(), "train.Trainer");
    for (auto& a : augmenters) row(a.address(), "train.Augmenter");
    if (ranks > 1) {
      auto where = [&](uint32_t r) {
        auto& p = places[r];
        return p.localRanks > 1 ? p.host + "/" + std::to_string(p.localRank) : p.host;
      };
      table += "DDP: " + std::to_string(ranks) + " ranks (" + where(0);
      for (uint32_t r = 1; r < ranks; ++r) table += ", " + where(r);
      table += "), MASTER_ADDR=" + masterAddr + " MASTER_PORT=" + std::to_string(masterPort) +
               "\n";
    }
    {
      std::lock_guard lock(mutex_);
      placements_ = table;
      driving_ = true;
    }
    running_.notify_all();

    // A data node that joins the running job gets augmenters, which every trainer takes at once.
    troupe::train::growOnJoin(
        job, spec, troupe::train::trainerList(kj::arrayPtr(trainers.data(), trainers.size())),
        augmenters, tasks_);

    // Each trainer starts training once its script called begin() (its first iter()).
    auto sources = KJ_MAP(a, augmenters) { return a.address(); };
    auto send = [&](troupe::Ref<hetero::Trainer>& trainer) {
      auto req = trainer.trainRequest();
      req.setEpochs(settings_.python ? 0 : settings_.epochs);  // 0: until the script ends
      req.setTrainSamples(samples_);
      auto list = req.initSources(sources.size());
      for (size_t i = 0; i < sources.size(); ++i) sources[i].toProto(list[i]);
      return req.send().ignoreResult();
    };
    auto train = send(trainers[0]).catch_([this](kj::Exception&& e) {
      // The trainer itself failed (not only its train()): the script hears it at its next batch.
      learner_->failed(e);
    });
    // Another rank's trainer ends when its script does; its failure, or its instance's loss,
    // fails the job at once, naming the rank.
    auto failed = kj::newPromiseAndFulfiller<void>();
    rankFailed_ = kj::mv(failed.fulfiller);
    auto others = kj::heapArrayBuilder<kj::Promise<void>>(ranks - 1);
    for (uint32_t rank = 1; rank < ranks; ++rank) {
      others.add(send(trainers[rank]).catch_([this, rank, host = places[rank].host](
                                                 kj::Exception&& e) {
        if (rankFailed_->isWaiting()) {
          // (a script's failure names its rank already)
          auto why = e.getDescription();
          rankFailed_->reject(
              why.startsWith("DDP rank ")
                  ? KJ_EXCEPTION(FAILED, kj::str(why, " (on ", host.c_str(), ")"))
                  : KJ_EXCEPTION(FAILED, kj::str("DDP rank ", rank, " on ", host.c_str(),
                                                 " ended: ", why)));
        }
      }));
    }
    auto rest = kj::joinPromises(others.finish()).fork();
    // The job ends when every rank's script did: a failure is the job's.
    auto ended =
        learner_->whenEnded()
            .then([&job, ranks, rest = rest.addBranch()](std::string failure) mutable
                  -> kj::Promise<void> {
              if (failure.empty()) return kj::mv(rest);
              auto why = kj::str("the training script failed: ", failure);
              if (ranks == 1) return KJ_EXCEPTION(FAILED, kj::mv(why));
              // Rank 0's error in a collective is often another rank's death seen first (gloo:
              // "Connection closed by peer"): that rank's own failure, if it comes within 3 s,
              // is the job's (failed.promise below).
              return job.timer().afterDelay(3 * kj::SECONDS).then([why = kj::mv(why)]() {
                kj::throwFatalException(KJ_EXCEPTION(FAILED, kj::str("DDP rank 0: ", why)));
              });
            })
            .exclusiveJoin(kj::mv(failed.promise));
    return ended.attach(kj::mv(augmenters), kj::mv(trainers), train.eagerlyEvaluate(nullptr),
                        rest.addBranch().eagerlyEvaluate(nullptr));
  }

  // "10.0.0.2:7077" -> "10.0.0.2"; "[::1]:7077" -> "::1".
  static std::string hostOf(std::string address) {
    auto colon = address.rfind(':');
    if (colon != std::string::npos) address.resize(colon);
    if (address.size() > 1 && address.front() == '[') {
      address = address.substr(1, address.size() - 2);
    }
    return address;
  }

  // A TCP port free on this host for rank 0's torch.distributed store (MASTER_PORT), unless the
  // environment names one.
  static uint16_t freePort() {
    if (const char* given = getenv("MASTER_PORT"); given != nullptr && *given) {
      return static_cast<uint16_t>(std::stoul(given));
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    KJ_REQUIRE(fd >= 0, "socket() for MASTER_PORT", strerror(errno));
    KJ_DEFER(close(fd));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t size = sizeof a;
    KJ_REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                   getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0,
               "no free port for MASTER_PORT", strerror(errno));
    return ntohs(a.sin_port);
  }

  mutable std::mutex mutex_;
  std::condition_variable running_;
  bool started_ = false, driving_ = false;
  Settings settings_;
  Format format_;
  uint64_t samples_ = 0;
  std::string placements_;
  std::shared_ptr<ScriptLearner> learner_;
  kj::Own<kj::PromiseFulfiller<void>> rankFailed_;
  std::vector<std::string> argv_;
  std::vector<char*> args_;
  troupe::Registry types_;
  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      fprintf(stderr, "troupe.data: adding a joined node's augmenters failed: %s\n",
              e.getDescription().cStr());
    }
  } quiet_;
  kj::TaskSet tasks_{quiet_};
};

}  // namespace

void startJob(std::vector<std::string> argv, Settings settings) {
  Job::get().start(std::move(argv), std::move(settings));
}

std::string jobPlacements() { return Job::get().placements(); }
const Format& jobFormat() { return Job::get().format(); }
std::shared_ptr<train::ScriptLearner> jobLearner() { return Job::get().learner(); }

Feed& feed() {
  if (!theFeed) throw std::runtime_error("troupe.data: the stream has not started");
  return *theFeed;
}

void setFeed(std::unique_ptr<Feed> feed) { theFeed = std::move(feed); }

}  // namespace troupe::python
