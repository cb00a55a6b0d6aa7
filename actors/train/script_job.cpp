// A training script's troupe job (script_job.h): the runtime on a thread, the driver of its
// streams.

#include "troupe/train/script_job.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "troupe/train/actors.h"
#include "augmenter_actor.h"
#include "trainer_actor.h"
#include "troupe/train/spawn.h"
#include "troupe/train/shared_source.h"
#include "train.capnp.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/epoch.h"
#include "troupe/loop.h"
#include "troupe/troupe.h"

namespace troupe::train {

void addScriptActorTypes(Registry& types) {
  types.add<AugmenterActor>();  // "train.Augmenter" (train.capnp's Augmenter)
  types.add<TrainerActor>();    // "train.Trainer"
}
namespace {

using troupe::train::ScriptLearner;

std::mutex feedsMutex;
std::map<uint32_t, std::unique_ptr<Feed>> theFeeds;

struct Stream {
  Settings settings;
  Format format;
  std::shared_ptr<ScriptLearner> learner;  // this process's (its local rank 0's)
};

// A DDP rank's place: its instance, and its process there (local rank 0: the troupe process).
struct RankPlace {
  std::string host;
  uint32_t localRank = 0, localRanks = 1;
};

class Job {
  // The process's troupe job: the runtime's thread, the streams, and what the script waits on.
 public:
  static Job& get() {
    static Job* job = new Job;  // never destroyed: the runtime ends the process with _exit
    return *job;
  }

  // Starts the runtime with the first stream; blocks (without the GIL) until this process is the
  // head and its driver runs, which on any other instance is never.
  void start(std::vector<std::string> argv, Settings settings) {
    {
      std::lock_guard lock(mutex_);
      if (started_) throw std::runtime_error("troupe.data: the job has started already");
      started_ = true;
    }
    auto& stream = add(std::move(settings));
    argv_ = std::move(argv);
    for (auto& a : argv_) args_.push_back(a.data());
    args_.push_back(nullptr);
    troupe::train::addScriptActorTypes(types_);
    std::thread([this]() {
      troupe::run(static_cast<int>(argv_.size()), args_.data(), types_,
                  [this](troupe::Driver& job) { return drive(job); });
    }).detach();
    // A trainer attached to this process's learner: it trains (the head is rank 0, other ranks
    // are the training group's other instances). On a data instance that is never.
    if (stream.learner->waitAttached().rank == 0) {
      std::unique_lock lock(mutex_);
      running_.wait(lock, [this] { return driver_ != nullptr; });
    }
  }

  // A later stream: on the head its actors are placed now, on the driver's thread.
  uint32_t addLater(Settings settings) {
    {
      std::lock_guard lock(mutex_);
      if (!started_) throw std::runtime_error("troupe.data: a later stream before the job started");
    }
    auto& stream = add(std::move(settings));
    uint32_t number = uint32_t(streams_.size() - 1);
    const kj::Executor* executor = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (executor_) executor = executor_.get();
    }
    if (executor != nullptr) {
      executor->executeSync([this, number]() { placeStream(number); });
    }
    (void)stream;
    return number;
  }

  const Stream& stream(uint32_t number) {
    std::lock_guard lock(mutex_);
    if (number >= streams_.size()) {
      throw std::runtime_error("troupe.data: no stream " + std::to_string(number));
    }
    return streams_[number];
  }
  uint32_t count() {
    std::lock_guard lock(mutex_);
    return uint32_t(streams_.size());
  }
  std::string placements() const {
    std::lock_guard lock(mutex_);
    return placements_;
  }

 private:
  // The stream's dataset, opened on every instance before its actors run (the file list is
  // shared with this process's augmenters), and the transform parsed against it: what cannot be
  // used raises in the script, naming it (SourceError, SpecError: RuntimeError, ValueError).
  Stream& add(Settings settings) {
    Stream stream;
    stream.settings = std::move(settings);
    auto& s = stream.settings;
    if (!s.dataset.empty()) {
      auto& f = stream.format;
      f.source = troupe::train::sharedSource(s.dataset, 0, s.imageFolder);
      if (s.transform.empty())
        s.transform = "RandomResizedCrop(224),RandomHorizontalFlip(),Normalize(imagenet)";
      auto pipeline = troupe::images::Pipeline::parse(s.transform);
      bool grey = f.source->encoding() == troupe::data::Encoding::kRawGrey8;
      f.shape = pipeline.outputShape(grey ? 1 : 3);
      f.dtype = pipeline.dtype();
      f.classes = uint32_t(f.source->classes().size());
    }
    std::lock_guard lock(mutex_);
    uint32_t number = uint32_t(streams_.size());
    stream.learner = ScriptLearner::findOrCreate(learnerId(number, 0));
    setFeed(number, learnerFeed(stream.learner));
    streams_.push_back(std::move(stream));
    return streams_.back();
  }

  kj::Promise<void> drive(troupe::Driver& job) {
    // The dataset's size, on the pool (unpacking it on the event loop starves heartbeats).
    auto& first = streams_.front();
    return job.loop()
        .offload([dir = first.settings.dataDir, source = first.format.source,
                  python = first.settings.python, samples = first.settings.samples]() -> size_t {
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
    auto& first = streams_.front();
    auto& s = first.settings;
    KJ_REQUIRE(s.samples <= available, "train_samples is larger than the training set", s.samples,
               available);
    if (!s.python) s.samples = s.samples ? s.samples : available;
    bool batched = first.format.source != nullptr || s.python;
    places_ = rankPlaces(job, batched);
    masterAddr_ = hostOf(job.node().address().cStr());
    masterPort_ = freePort(masterAddr_);  // one rank too: torchrun sets it for one process
    std::random_device entropy;
    jobSeed_ = (uint64_t(entropy()) << 32 | entropy()) & ((1ull << 62) - 1);
    auto failed = kj::newPromiseAndFulfiller<void>();
    rankFailed_ = kj::mv(failed.fulfiller);
    auto placed = placeStream(job, 0);
    {
      std::lock_guard lock(mutex_);
      driver_ = &job;
      executor_ = kj::getCurrentThreadExecutor().addRef();
    }
    running_.notify_all();

    // The job ends when every rank's script did: a failure is the job's.
    auto ranks = static_cast<uint32_t>(places_.size());
    auto ended =
        first.learner->whenEnded()
            .then([&job, ranks, rest = kj::mv(placed.rest)](std::string failure) mutable
                  -> kj::Promise<void> {
              if (failure.empty()) return kj::mv(rest);
              auto why = kj::str("the training script failed: ", failure);
              if (ranks == 1) {
                // (KJ_EXCEPTION would prefix a variable's text with its name: "kj::mv(why) = ")
                return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::mv(why));
              }
              // Rank 0's error in a collective is often another rank's death seen first (gloo:
              // "Connection closed by peer"): that rank's own failure, if it comes within 3 s,
              // is the job's (failed.promise below).
              return job.timer().afterDelay(3 * kj::SECONDS).then([why = kj::mv(why)]() {
                kj::throwFatalException(KJ_EXCEPTION(FAILED, kj::str("DDP rank 0: ", why)));
              });
            })
            .exclusiveJoin(kj::mv(failed.promise));
    return kj::mv(ended);
  }

  struct Placed {
    kj::Promise<void> rest = nullptr;  // the other ranks' trainers' train(): their scripts' ends
  };

  Placed placeStream(uint32_t number) { return placeStream(*driver_, number); }

  // Stream `number`'s augmenters and a trainer per rank, each trainer in its rank's process; its
  // train() calls go out at once (each starts once its script's first iter() begin()s it).
  Placed placeStream(troupe::Driver& job, uint32_t number) {
    auto& stream = streams_[number];
    auto& s = stream.settings;
    uint64_t samples = s.samples;
    if (!s.python && samples == 0 && stream.format.source) samples = stream.format.source->size();
    auto augment = s.augment == "light" ? troupe::augment::AugmentConfig::light()
                                        : troupe::augment::AugmentConfig::heavy();
    if (s.blur >= 0) augment.blurKernel = s.blur;
    augment.validate();
    bool batched = stream.format.source != nullptr || s.python;
    auto spec = troupe::train::augmenterSpecOf(s, samples, augment, batched);
    spec.imageFolder = s.imageFolder;
    spec.decodeScaling = s.decodeScaling;
    spec.python = s.python;
    spec.shuffle = s.shuffle;
    spec.planned = s.planned;
    if (s.python || (s.planned && number > 0)) {
      // A DataLoader's augmenters reserve no CPU (its workers use them): as many per node as the
      // node has workers, so that every worker has its prefetch_factor batches in the making. (A
      // later loader's over an ImageDataset shares the CPUs with the first's.)
      spec.cpus = 0;
      spec.perNode = s.perNode ? s.perNode : s.workers ? s.workers : dataGroupVcpus(job, s);
    }
    spec.loader = number;
    spec.workers = s.workers;
    spec.prefetchFactor = s.prefetchFactor;
    spec.sharedMemoryBytes = s.sharedMemory;
    spec.pickled = s.pickled;
    if (s.hasImageSeed) spec.imageSeed = s.imageSeed;
    auto prefix = number == 0 ? std::string() : "loader" + std::to_string(number) + "-";
    auto augmenters = job.spawnMany<hetero::Augmenter>(
        troupe::train::augmenterPlacement(spec),
        troupe::train::augmenterOptions(spec, prefix + "augmenter"));
    auto ranks = static_cast<uint32_t>(places_.size());
    std::vector<troupe::Ref<hetero::Trainer>> trainers;
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      auto& at = places_[rank];
      troupe::train::TrainerSpec t;
      t.name = prefix + (rank == 0 ? std::string("trainer") : "trainer-" + std::to_string(rank));
      t.batchSize = s.batchSize;
      t.seed = s.planned ? 0 : s.seed;  // a planned pass's seeds are the script's
      t.prefetch = s.planned ? s.prefetchFactor : s.prefetch;
      t.samplesSetting = s.planned ? 0 : s.samples;
      t.python = s.python;
      t.workerSpec = s.pickled;
      if (!s.python && stream.format.source) {
        t.sample = troupe::train::SampleSpec{stream.format.shape, stream.format.dtype,
                                             stream.format.classes};
      }
      t.batched = batched || s.planned;
      t.shuffle = s.shuffle;
      t.dropLast = s.dropLast;
      t.inOrder = s.inOrder;
      t.planned = s.planned;
      t.rank = rank;
      t.ranks = ranks;
      // Stopped early (SIGTERM), it waits for the script to save its state and end.
      t.stopTimeout = static_cast<int64_t>(s.stopTimeoutSeconds) * kj::SECONDS;
      t.quiet = true;
      // In the rank's script's process, reserving none of its instance's CPUs: the script's
      // work is the script's (a trainer each for a script's many loaders, and augmenters
      // restarted on the instance while a data instance is away, all fit).
      trainers.push_back(job.spawn<hetero::Trainer>(
          troupe::Placement::any().labels("host=" + at.host).cpus(0),
          troupe::train::trainerOptions(t, [&](hetero::TrainerArgs::Builder a) {
            // The script's own: its learner in the rank's process, its stream, its DDP rank.
            a.setScript(learnerId(number, at.localRank));
            a.setLoader(number);
            auto ddp = a.initDdp();
            ddp.setMasterAddr(masterAddr_);
            ddp.setMasterPort(masterPort_);
            ddp.setLocalRank(at.localRank);
            ddp.setLocalRanks(at.localRanks);
            ddp.setSeed(jobSeed_);
          })));
    }
    describe(number, trainers, augmenters);

    // A data node that joins the running job gets augmenters, which every trainer takes at once.
    troupe::train::growOnJoin(
        job, spec, troupe::train::trainerList(kj::arrayPtr(trainers.data(), trainers.size())),
        augmenters, tasks_);

    // Each trainer starts training once its script called begin() (its first iter()).
    auto send = [&](troupe::Ref<hetero::Trainer>& trainer) {
      return troupe::train::trainRequest(trainer, s.python || s.planned ? 0 : s.epochs, samples,
                                         augmenters)  // 0 epochs: until the script ends
          .send()
          .ignoreResult();
    };
    auto learner = stream.learner;
    tasks_.add(send(trainers[0]).catch_([learner](kj::Exception&& e) {
      // The trainer itself failed (not only its train()): the script hears it at its next batch.
      learner->failed(e);
    }));
    // Another rank's trainer ends when its script does; its failure, or its instance's loss,
    // fails the job at once, naming the rank.
    auto others = kj::heapArrayBuilder<kj::Promise<void>>(ranks - 1);
    for (uint32_t rank = 1; rank < ranks; ++rank) {
      others.add(send(trainers[rank]).catch_([this, rank, host = places_[rank].host](
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
    tasks_.add(rest.addBranch());
    // The refs live as long as the job.
    held_.push_back(kj::heap<Held>(Held{kj::mv(augmenters), kj::mv(trainers)}));
    return Placed{rest.addBranch()};
  }

  // The most vCPUs of a node of the stream's data group (what a node's default worker count is at
  // most), or of any node where the cluster has no data group.
  static uint32_t dataGroupVcpus(troupe::Driver& job, const Settings& s) {
    uint32_t most = 0, any = 1;
    for (auto& n : job.nodes()) {
      any = std::max(any, n.vcpus());
      if (n.group() == s.dataGroup.c_str()) most = std::max(most, n.vcpus());
    }
    return most ? most : any;
  }

  // The driver's table of where stream `number`'s actors went.
  void describe(uint32_t number, std::vector<troupe::Ref<hetero::Trainer>>& trainers,
                kj::Array<troupe::Ref<hetero::Augmenter>>& augmenters) {
    std::string table = number == 0 ? std::string()
                                     : "stream " + std::to_string(number) + " (a later loader)\n";
    table += "actor          type             host     group\n";
    auto row = [&](const troupe::ActorAddress& a, const char* type) {
      char line[160];
      snprintf(line, sizeof line, "%-14s %-16s %-8s %s\n", a.name.c_str(), type, a.host.c_str(),
               a.group.c_str());
      table += line;
    };
    for (auto& t : trainers) row(t.address(), "train.Trainer");
    for (auto& a : augmenters) row(a.address(), "train.Augmenter");
    auto ranks = static_cast<uint32_t>(places_.size());
    if (ranks > 1) {
      auto where = [&](uint32_t r) {
        auto& p = places_[r];
        return p.localRanks > 1 ? p.host + "/" + std::to_string(p.localRank) : p.host;
      };
      table += "DDP: " + std::to_string(ranks) + " ranks (" + where(0);
      for (uint32_t r = 1; r < ranks; ++r) table += ", " + where(r);
      table += "), MASTER_ADDR=" + masterAddr_ + " MASTER_PORT=" + std::to_string(masterPort_) +
               "\n";
    }
    std::lock_guard lock(mutex_);
    placements_ += table;
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

  // A TCP port free on this host's cluster address (MASTER_ADDR) for rank 0's torch.distributed
  // store (MASTER_PORT), unless the environment names one. The probe binds that address only,
  // never every interface (torch's store then listens where torch listens: docs/security.md).
  static uint16_t freePort(const std::string& address) {
    if (const char* given = getenv("MASTER_PORT"); given != nullptr && *given) {
      return static_cast<uint16_t>(std::stoul(given));
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    KJ_REQUIRE(fd >= 0, "socket() for MASTER_PORT", strerror(errno));
    KJ_DEFER(close(fd));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1)
      a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t size = sizeof a;
    KJ_REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                   getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0,
               "no free port for MASTER_PORT", strerror(errno));
    return ntohs(a.sin_port);
  }

  struct Held {
    kj::Array<troupe::Ref<hetero::Augmenter>> augmenters;
    std::vector<troupe::Ref<hetero::Trainer>> trainers;
  };

  mutable std::mutex mutex_;
  std::condition_variable running_;
  bool started_ = false;
  std::deque<Stream> streams_;  // (a deque: a stream's reference stays as others are added)
  std::string placements_;
  troupe::Driver* driver_ = nullptr;          // the head's, once it drives
  kj::Own<const kj::Executor> executor_;      // the driver's thread
  std::vector<RankPlace> places_;
  std::string masterAddr_;
  uint16_t masterPort_ = 0;
  uint64_t jobSeed_ = 0;
  kj::Own<kj::PromiseFulfiller<void>> rankFailed_;
  std::vector<kj::Own<Held>> held_;  // the driver's thread's
  std::vector<std::string> argv_;
  std::vector<char*> args_;
  troupe::Registry types_;
  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      fprintf(stderr, "troupe.data: %s\n", e.getDescription().cStr());
    }
  } quiet_;
  kj::TaskSet tasks_{quiet_};
};

}  // namespace

uint64_t learnerId(uint32_t stream, uint32_t localRank) {
  return 1 + (uint64_t(stream) << 16) + localRank;
}

void startJob(std::vector<std::string> argv, Settings settings) {
  Job::get().start(std::move(argv), std::move(settings));
}

uint32_t addStream(Settings settings) { return Job::get().addLater(std::move(settings)); }
std::string jobPlacements() { return Job::get().placements(); }
const Format& streamFormat(uint32_t stream) { return Job::get().stream(stream).format; }
uint32_t streamCount() { return Job::get().count(); }

Feed& feed(uint32_t stream) {
  std::lock_guard lock(feedsMutex);
  auto it = theFeeds.find(stream);
  if (it == theFeeds.end()) {
    throw std::runtime_error("troupe.data: stream " + std::to_string(stream) +
                             " has not started");
  }
  return *it->second;
}

void setFeed(uint32_t stream, std::unique_ptr<Feed> feed) {
  std::lock_guard lock(feedsMutex);
  theFeeds[stream] = std::move(feed);
}

}  // namespace troupe::train
