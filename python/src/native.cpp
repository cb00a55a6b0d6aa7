// troupe._native: the C++ side of the Python package (python/troupe/data.py).
//
// One troupe job per process, as in a C++ app: start() runs troupe::run() on a thread of its own
// with this module's actors (train.Augmenter, train.Trainer) and a driver that places them as
// hetero_train does, the trainer in this process with a ScriptLearner (script_learner.h) that
// hands its batches to the script. On the head (a dnn instance) start() returns once the driver
// runs; on every other instance it never returns: the process serves augmenters until the job
// ends and troupe::run() ends it with the job's exit code, as it ends every process.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <csignal>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "augmenter_actor.h"
#include "augmenter_spawn.h"
#include "script_learner.h"
#include "train.capnp.h"
#include "trainer_actor.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/epoch.h"
#include "troupe/images/transforms.h"
#include "local_ranks.h"
#include "workers.h"
#include "troupe/loop.h"
#include "troupe/troupe.h"

namespace py = pybind11;
using troupe::train::ScriptLearner;

// A shared object cannot have run()'s .preinit_array entry (troupe/run.h): defined here, it is
// not linked; the module holds the stop signals when it is imported instead (PYBIND11_MODULE).
namespace troupe::detail {
const bool kStopsHeldFromStart = false;
}  // namespace troupe::detail

namespace {

// What the module's functions feed the script from: the process's learner (a troupe process), or
// the instance's troupe process's (a local rank's process; local_ranks.h).
std::unique_ptr<troupe::python::Feed> theFeed;
troupe::python::Feed& feed() {
  if (!theFeed) throw std::runtime_error("troupe.data: the stream has not started");
  return *theFeed;
}

struct Settings {
  unsigned epochs = 5;
  unsigned batchSize = 128;
  unsigned prefetch = 4;
  uint64_t seed = 42;
  uint64_t samples = 0;  // 0: the whole training set
  std::string augment = "heavy";
  int blur = -1;         // -1: the preset's
  unsigned perNode = 0;  // augmenters per data node; 0: one per vCPU
  unsigned restarts = 3;
  unsigned stopTimeoutSeconds = 30;
  std::string dataDir = troupe::data::kDefaultFashionMnistDir;
  std::string dataGroup = "data_group";
  // A dataset of any kind and its transform (docs/data.md); empty: Fashion-MNIST from dataDir.
  std::string dataset, transform;
  bool skipBadSamples = false;
  bool shuffle = true, dropLast = false;  // a dataset's epoch, cut as torch's DataLoader cuts it
  // troupe.data.DataLoader: the script's own Dataset (`samples` long) in this process's worker
  // processes (workers.h), epochs until the script ends.
  bool python = false;
  bool inOrder = false;  // the batches reach the script in the epoch's order
};

// A dataset's samples as the transform writes them (set by start() before the runtime runs).
struct Format {
  std::shared_ptr<const troupe::data::Source> source;
  troupe::images::Shape shape;
  troupe::images::Dtype dtype = troupe::images::Dtype::kUint8;
  uint32_t classes = 0;
};

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
    theFeed = troupe::python::learnerFeed(learner_);
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
    troupe::train::AugmenterSpec spec;
    spec.seed = s.seed;
    spec.batchSize = s.batchSize;
    spec.dataDir = s.dataDir;
    spec.samples = samples_;
    spec.augment = s.augment == "light" ? troupe::augment::AugmentConfig::light()
                                        : troupe::augment::AugmentConfig::heavy();
    if (s.blur >= 0) spec.augment.blurKernel = s.blur;
    spec.augment.validate();
    spec.restarts = s.restarts;
    spec.perNode = s.perNode;
    spec.dataGroup = s.dataGroup;
    spec.dataset = s.dataset;
    spec.transform = s.transform;
    spec.skipBadSamples = s.skipBadSamples;
    spec.batched = format_.source != nullptr || s.python;
    spec.python = s.python;
    spec.shuffle = s.shuffle;
    spec.dropLast = s.dropLast;
    auto augmenters =
        job.spawnMany<hetero::Augmenter>(troupe::train::augmenterPlacement(spec),
                                         troupe::train::augmenterOptions(spec, "augmenter"));
    // A trainer per rank, in its script's process: rank 0's here, the others' on the training
    // group's other instances; their batches go to their scripts.
    auto places = rankPlaces(job, spec.batched);
    auto ranks = static_cast<uint32_t>(places.size());
    std::string masterAddr = hostOf(job.node().address().cStr());
    uint16_t masterPort = ranks > 1 ? freePort() : 0;
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
    auto ended = learner_->whenEnded()
                     .then([rest = rest.addBranch()](std::string failure) mutable {
                       if (!failure.empty()) {
                         kj::throwFatalException(KJ_EXCEPTION(
                             FAILED, kj::str("the training script failed: ", failure)));
                       }
                       return kj::mv(rest);
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

// A received batch as arrays: images (N, 1, 28, 28), float32 normalised or uint8 as sent,
// labels and sample ids as int64.
// Values as an int64 array.
template <typename T>
py::array_t<int64_t> int64Array(const std::vector<T>& values) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

// The received batch's bytes, kept alive by the capsule every array over them holds.
py::capsule holder(troupe::Received&& bytes, const uint8_t*& base) {
  auto* held = new troupe::Received(std::move(bytes));
  base = held->as<uint8_t>().data();
  return py::capsule(held, [](void* p) { delete static_cast<troupe::Received*>(p); });
}

// A dataset's batch: the transform's output as it came (no copy), (N, C, H, W) or (N, H, W, C)
// in its dtype; targets as int64.
py::tuple datasetArrays(ScriptLearner::Item& item, const Format& f) {
  auto& b = item.batch;
  auto n = static_cast<py::ssize_t>(b.ids.size());
  auto& s = f.shape;
  std::vector<py::ssize_t> shape = s.channelsFirst
                                       ? std::vector<py::ssize_t>{n, s.channels, s.height, s.width}
                                       : std::vector<py::ssize_t>{n, s.height, s.width, s.channels};
  const uint8_t* base = nullptr;
  auto owner = holder(std::move(b.images), base);
  const char* format = f.dtype == troupe::images::Dtype::kFloat32   ? "f"
                       : f.dtype == troupe::images::Dtype::kFloat16 ? "e"
                                                                    : "B";
  py::array images(py::dtype(format), shape, base, owner);
  return py::make_tuple(images, int64Array(b.targets), int64Array(b.ids));
}

// A dataset's batch as tensors (for a local rank's process, which has no format): the images as
// the transform wrote them, then the targets (int64) after them.
void datasetTensors(troupe::train::StepBatch& b, const Format& f) {
  auto n = int64_t(b.ids.size());
  auto& s = f.shape;
  troupe::train::MadeTensor images, targets;
  images.dtype = f.dtype == troupe::images::Dtype::kFloat32   ? "<f4"
                 : f.dtype == troupe::images::Dtype::kFloat16 ? "<f2"
                                                              : "|u1";
  images.shape = s.channelsFirst ? std::vector<int64_t>{n, s.channels, s.height, s.width}
                                 : std::vector<int64_t>{n, s.height, s.width, s.channels};
  images.bytes = b.images.size();
  targets.dtype = "<i8";
  targets.shape = {int64_t(b.targets.size())};
  targets.offset = (images.bytes + 7) / 8 * 8;
  targets.bytes = b.targets.size() * sizeof(int64_t);
  std::vector<kj::byte> all(targets.offset + targets.bytes);
  std::memcpy(all.data(), b.images.bytes().begin(), images.bytes);
  std::memcpy(all.data() + targets.offset, b.targets.data(), targets.bytes);
  b.images = troupe::Received::keep(capnp::Data::Reader(all.data(), all.size()));
  b.tensors = {images, targets};
  b.structure = R"({"tuple": [{"t": 0}, {"t": 1}]})";
}

// A script's Dataset's batch (DataLoader): each tensor a numpy array over the received bytes (no
// copy; one owner for them all), the structure they nest in, the sample ids.
py::tuple madeArrays(ScriptLearner::Item& item) {
  auto& b = item.batch;
  const uint8_t* base = nullptr;
  auto owner = holder(std::move(b.images), base);
  py::list tensors;
  for (auto& t : b.tensors) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    tensors.append(
        py::array(py::dtype::from_args(py::str(t.dtype)), shape, base + t.offset, owner));
  }
  return py::make_tuple(tensors, py::str(b.structure), int64Array(b.ids));
}

py::tuple batchArrays(ScriptLearner::Item& item, bool normalize) {
  if (!item.batch.tensors.empty()) return madeArrays(item);
  if (Job::get().format().source) return datasetArrays(item, Job::get().format());
  auto& b = item.batch;
  auto n = static_cast<py::ssize_t>(b.ids.size());
  std::vector<py::ssize_t> shape{n, 1, 28, 28};
  py::object images;
  if (normalize) {
    py::array_t<float> out(shape);
    auto* dst = out.mutable_data();
    {
      py::gil_scoped_release release;
      if (b.bytes) {
        troupe::augment::normalizeImages(b.images.as<uint8_t>(), std::span<float>(dst, n * 784));
      } else {
        auto src = b.images.as<float>();
        std::copy(src.begin(), src.end(), dst);
      }
    }
    images = std::move(out);
  } else if (b.bytes) {
    // The received buffer itself, kept alive by the array (no copy).
    auto* held = new troupe::Received(std::move(b.images));
    py::capsule owner(held, [](void* p) { delete static_cast<troupe::Received*>(p); });
    images = py::array_t<uint8_t>(shape, const_cast<uint8_t*>(held->as<uint8_t>().data()), owner);
  } else {
    auto* held = new troupe::Received(std::move(b.images));
    py::capsule owner(held, [](void* p) { delete static_cast<troupe::Received*>(p); });
    images = py::array_t<float>(shape, const_cast<float*>(held->as<float>().data()), owner);
  }
  py::array_t<int64_t> labels(n), ids(n);
  auto* l = labels.mutable_data();
  auto* d = ids.mutable_data();
  for (py::ssize_t i = 0; i < n; ++i) {
    l[i] = b.labels[i];
    d[i] = b.ids[i];
  }
  return py::make_tuple(images, labels, ids);
}

const char* kindName(ScriptLearner::Item::Kind k) {
  switch (k) {
    case ScriptLearner::Item::kBatch:
      return "batch";
    case ScriptLearner::Item::kEpochEnd:
      return "epoch_end";
    case ScriptLearner::Item::kFinished:
      return "finished";
    case ScriptLearner::Item::kStopped:
      return "stopped";
    case ScriptLearner::Item::kFailed:
      return "failed";
  }
  return "?";
}

}  // namespace

void bindImages(py::module_& m);  // images.cpp

PYBIND11_MODULE(_native, m) {
  bindImages(m);
  m.doc() = "troupe's runtime and data plane for the Python package (troupe.data)";
  // As troupe::run() does from a program's first instruction: a SIGTERM before the node is up
  // is recorded and handed to it, not the default action (threads started from here on inherit
  // this).
  troupe::holdStopSignals();

  m.def(
      "start",
      [](std::vector<std::string> argv, py::dict options) {
        Settings s;
        auto get = [&](const char* key, auto& field) {
          if (options.contains(key)) field = options[key].cast<std::decay_t<decltype(field)>>();
        };
        get("epochs", s.epochs);
        get("batch_size", s.batchSize);
        get("prefetch", s.prefetch);
        get("seed", s.seed);
        get("train_samples", s.samples);
        get("augment", s.augment);
        get("blur", s.blur);
        get("augmenters_per_node", s.perNode);
        get("restarts", s.restarts);
        get("stop_timeout", s.stopTimeoutSeconds);
        get("data_dir", s.dataDir);
        get("data_group", s.dataGroup);
        get("dataset", s.dataset);
        get("transform", s.transform);
        get("skip_bad_samples", s.skipBadSamples);
        get("shuffle", s.shuffle);
        get("drop_last", s.dropLast);
        get("python", s.python);
        get("in_order", s.inOrder);
        if ((options.contains("shuffle") || options.contains("drop_last")) && s.dataset.empty() &&
            !s.python) {
          throw py::value_error("shuffle and drop_last need dataset= (docs/data.md)");
        }
        py::gil_scoped_release release;
        Job::get().start(std::move(argv), std::move(s));
      },
      "Starts this process's troupe job; returns on the head once its driver runs, never "
      "elsewhere.");
  m.def("placements", []() { return Job::get().placements(); });
  m.def(
      "epoch_order",
      [](uint64_t samples, uint64_t seed, uint64_t epoch, bool shuffle, uint32_t batchSize,
         bool dropLast, uint32_t rank, uint32_t ranks) {
        // The epoch's order as the data group cuts it (troupe/dataset/epoch.h, BatchedEpoch): of
        // one rank every sample, of several the rank's share (its batches, in order).
        troupe::data::BatchedEpoch plan{samples, batchSize, shuffle, dropLast, rank, ranks};
        try {
          plan.check();
        } catch (const troupe::data::DatasetError& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(int64Array(plan.order(seed, epoch)), plan.used(), plan.dropped());
      },
      py::arg("samples"), py::arg("seed"), py::arg("epoch"), py::arg("shuffle"),
      py::arg("batch_size") = 1, py::arg("drop_last") = false, py::arg("rank") = 0,
      py::arg("ranks") = 1,
      "(order, used, dropped): the rank's order of sample ids, how many of them it trains, and "
      "the samples of the epoch no rank trains.");
  m.def(
      "rank",
      []() {
        // This process's place in a DDP job, as torchrun would have put it in the environment.
        troupe::train::ScriptLearner::Rank r;
        {
          py::gil_scoped_release release;
          r = feed().rank();
        }
        py::dict d;
        d["RANK"] = r.rank;
        d["WORLD_SIZE"] = r.ranks;
        d["LOCAL_RANK"] = r.localRank;
        d["LOCAL_WORLD_SIZE"] = r.localRanks;
        d["MASTER_ADDR"] = r.masterAddr;
        d["MASTER_PORT"] = r.masterPort;
        return d;
      },
      "This process's rank in the job (after start()): RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.");
  m.def(
      "set_workers",
      [](std::vector<std::tuple<int, int, int, int, size_t>> workers) {
        std::vector<troupe::python::WorkerFds> fds;
        for (auto& [pid, request, reply, memory, size] : workers) {
          fds.push_back({pid, request, reply, memory, size});
        }
        troupe::train::setBatchMaker(std::make_shared<troupe::python::ProcessWorkers>(fds));
      },
      "This process's DataLoader worker processes: (pid, request fd, reply fd, memfd, size) each.");
  m.def(
      "serve_local",
      [](uint32_t localRank, int fd, int pid) {
        // The instance's troupe process: local rank `localRank`'s process, at the other end of
        // `fd`, gets its batches from the trainer of that rank in this process.
        std::function<void(troupe::train::StepBatch&)> toTensors;
        if (Job::get().format().source) {
          toTensors = [](troupe::train::StepBatch& b) { datasetTensors(b, Job::get().format()); };
        }
        troupe::python::serveLocalRank(
            ScriptLearner::findOrCreate(Job::get().learner()->id() + localRank), fd, pid,
            localRank, toTensors);
      },
      py::arg("local_rank"), py::arg("fd"), py::arg("pid"));
  m.def(
      "connect_local",
      [](int fd, int parent) {
        // A local rank's process: its batches come from the instance's troupe process `parent`,
        // served at the other end of `fd`; it never outlives that process.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);  // it has already ended
        theFeed = troupe::python::localRankFeed(fd);
      },
      py::arg("fd"), py::arg("parent"));
  m.def("begin", []() { feed().begin(); });
  m.def(
      "handoffs",
      []() {
        auto h = feed().handoffs();
        return py::make_tuple(h.count, h.seconds);
      },
      "(batches, seconds): the handoffs so far, from asking for a batch that was already queued "
      "to holding it as arrays.");
  m.def(
      "abandon", [](uint32_t epoch) { feed().abandon(epoch); },
      "The script left `epoch` (a break): its batches not yet handed over are not trained on.");
  m.def(
      "next",
      [](bool normalize) -> py::tuple {
        ScriptLearner::Item item;
        auto asked = std::chrono::steady_clock::now();
        {
          py::gil_scoped_release release;
          item = feed().next();
        }
        if (item.kind == ScriptLearner::Item::kBatch) {
          bool waited = item.batch.waited;
          auto arrays = batchArrays(item, normalize);
          if (!waited) {
            feed().handedOver(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
          }
          return py::make_tuple(kindName(item.kind), item.epoch, arrays[0], arrays[1], arrays[2]);
        }
        return py::make_tuple(kindName(item.kind), item.epoch, item.text, py::none(), py::none());
      },
      py::arg("normalize") = true);
  m.def("state", []() {
    std::string bytes;
    {
      py::gil_scoped_release release;
      bytes = feed().state();
    }
    return py::bytes(bytes);
  });
  m.def("load_state", [](py::bytes bytes, std::string name) {
    return feed().resumeFrom(std::string(bytes), name);
  });
  m.def(
      "end",
      [](std::string failure) {
        // The job ends with the script: on the head the runtime stops every actor, tells every
        // node to exit and ends this process with the job's exit code. Never returns.
        fflush(stdout);
        fflush(stderr);
        py::gil_scoped_release release;
        feed().end(std::move(failure));
        feed().waitForJobEnd();
      },
      py::arg("failure") = "");
  py::register_exception<troupe::train::CheckpointError>(m, "StateError", PyExc_ValueError);

  // For a script without troupe's data group (the plain PyTorch baseline): the same data and the
  // same augmentation, in the script's own process and its DataLoader's workers.
  m.def(
      "fashion_mnist",
      [](std::string split, std::string dir) {
        auto set = troupe::data::loadFashionMnist(
            dir, split == "test" ? troupe::data::Split::kTest : troupe::data::Split::kTrain);
        auto n = static_cast<py::ssize_t>(set.labels.size());
        py::array_t<uint8_t> images(std::vector<py::ssize_t>{n, 28, 28});
        std::copy(set.pixels.begin(), set.pixels.end(), images.mutable_data());
        py::array_t<int64_t> labels(n);
        std::copy(set.labels.begin(), set.labels.end(), labels.mutable_data());
        return py::make_tuple(images, labels);
      },
      py::arg("split"), py::arg("data_dir") = troupe::data::kDefaultFashionMnistDir);
  py::class_<troupe::augment::Augmenter>(m, "Augmenter")
      .def(py::init([](std::string preset, int blur) {
             auto config = preset == "light" ? troupe::augment::AugmentConfig::light()
                                             : troupe::augment::AugmentConfig::heavy();
             if (blur >= 0) config.blurKernel = blur;
             return troupe::augment::Augmenter(config);
           }),
           py::arg("preset") = "heavy", py::arg("blur") = -1)
      .def(
          "augment",
          [](const troupe::augment::Augmenter& a, py::array_t<uint8_t, py::array::c_style> pixels,
             uint64_t seed) {
            auto n = static_cast<py::ssize_t>(pixels.size() / 784);
            py::array_t<float> out(std::vector<py::ssize_t>{n, 1, 28, 28});
            std::span<const uint8_t> in(pixels.data(), pixels.size());
            std::span<float> dst(out.mutable_data(), out.size());
            {
              py::gil_scoped_release release;
              a.augment(in, 28, 28, seed, dst);
            }
            return out;
          },
          "Augments (N, 28, 28) uint8 images into normalised float32 (N, 1, 28, 28).");
}
