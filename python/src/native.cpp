// troupe._native: the C++ side of the Python package (python/troupe/data.py), its bindings only:
// the process's troupe job (troupe/train/script_job.h) and the batches it hands the script, as
// numpy arrays over the received bytes.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/prctl.h>
#include <csignal>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>

#include "troupe/train/script_learner.h"
#include "troupe/augment/augment.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/epoch.h"
#include "troupe/images/transforms.h"
#include "troupe/train/script_job.h"
#include "troupe/train/local_ranks.h"
#include "troupe/loop.h"
#include "troupe/run.h"  // kStopsHeldFromStart, defined below
#include "troupe/train/worker_pool.h"

namespace py = pybind11;
using namespace troupe::train;  // feed(), the job (troupe/train/script_job.h)
using troupe::train::ScriptLearner;

// A shared object cannot have run()'s .preinit_array entry (troupe/run.h): defined here, it is
// not linked; the module holds the stop signals when it is imported instead (PYBIND11_MODULE).
namespace troupe::detail {
const bool kStopsHeldFromStart = false;
}  // namespace troupe::detail

namespace {

// What an option of this C++ type takes, in Python's words, for a TypeError naming the option.
template <typename T>
std::string pythonTypeWanted() {
  if constexpr (std::is_same_v<T, bool>) return "True or False";
  else if constexpr (std::is_unsigned_v<T>) return "an int, 0 or more";
  else if constexpr (std::is_integral_v<T>) return "an int";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else return "a str";
}

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
  size_t total = b.images.size();
  auto owner = holder(std::move(b.images), base);
  py::list tensors;
  for (auto& t : b.tensors) {
    // The trainer checked these when the batch came (trainer_batches.cpp); a view past the
    // bytes received is never made, whatever reached this far.
    if (t.offset > total || t.bytes > total - t.offset ||
        !troupe::train::tensorBytesFit(t.dtype, t.shape, t.bytes)) {
      throw std::runtime_error("a received batch's tensor of dtype '" + t.dtype + "', " +
                               std::to_string(t.bytes) + " bytes at " + std::to_string(t.offset) +
                               " does not fit its " + std::to_string(total) +
                               " bytes or its shape");
    }
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    tensors.append(
        py::array(py::dtype::from_args(py::str(t.dtype)), shape, base + t.offset, owner));
  }
  return py::make_tuple(tensors, py::str(b.structure), int64Array(b.ids));
}

// A stream's format, where this process has the stream (a local rank's process has none: its
// batches come as tensors).
const Format* formatOf(uint32_t stream) {
  return stream < streamCount() ? &streamFormat(stream) : nullptr;
}

py::tuple batchArrays(ScriptLearner::Item& item, bool normalize, uint32_t stream) {
  // A script's Dataset's batch has a structure (which may hold no tensor: numbers, strings).
  if (!item.batch.tensors.empty() || !item.batch.structure.empty()) return madeArrays(item);
  if (auto* f = formatOf(stream); f != nullptr && f->source) return datasetArrays(item, *f);
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

// A local rank's process: the socket to its troupe process (connect_local), and its streams.
int localFd = -1;
uint32_t localStreams = 0;

// How the script ended, for the job: its exception's line (set by troupe.data's exception hook),
// and whether the job was stopping (Stopped ended it: the job's code is INTERRUPTED's).
std::string scriptFailure;
bool scriptStopped = false;
std::atomic<bool> exiting{false};

// The job ends with the script's process, whatever its status: on the head the runtime stops
// every actor, tells every node to exit and ends this process with the job's exit code. Never
// returns.
[[noreturn]] void endJob(const std::string& failure) {
  fflush(stdout);
  fflush(stderr);
  feed(0).endAll(failure);
  feed(0).waitForJobEnd();
}

// exit()'s last word on the script: its status, as the shell would see it (sys.exit(4), an
// exception's 1, 0 at its last line). Not 0 is the job's failure, named.
void endWithStatus(int status, void*) {
  if (exiting.exchange(true)) return;
  std::string failure;
  if (status != 0 && !scriptStopped) {
    failure = !scriptFailure.empty()
                  ? scriptFailure
                  : "it exited with status " + std::to_string(status) + " (sys.exit(" +
                        std::to_string(status) + ") or SystemExit(" + std::to_string(status) +
                        "))";
  }
  endJob(failure);
}

// A stream's settings from troupe.data's options, each of the wrong type a TypeError naming it.
Settings settingsFrom(py::dict options) {
  Settings s;
  auto get = [&](const char* key, auto& field) {
    if (!options.contains(key)) return;
    py::object value = options[key];
    try {
      field = value.cast<std::decay_t<decltype(field)>>();
    } catch (const py::cast_error&) {
      throw py::type_error(std::string("troupe.data: option ") + key + "=" +
                           py::repr(value).cast<std::string>() + ": " +
                           pythonTypeWanted<std::decay_t<decltype(field)>>() +
                           " (docs/pytorch.md, the options)");
    }
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
  get("max_image_pixels", s.maxImagePixels);
  get("image_folder", s.imageFolder);
  get("decode_scaling", s.decodeScaling);
  get("shuffle", s.shuffle);
  get("drop_last", s.dropLast);
  get("python", s.python);
  get("planned", s.planned);
  get("in_order", s.inOrder);
  get("workers", s.workers);
  get("prefetch_factor", s.prefetchFactor);
  get("shared_memory", s.sharedMemory);
  get("pickled", s.pickled);
  if (options.contains("image_seed") && !options["image_seed"].is_none()) {
    s.hasImageSeed = true;
    get("image_seed", s.imageSeed);
  }
  if ((options.contains("shuffle") || options.contains("drop_last")) && s.dataset.empty() &&
      !s.python && !s.planned) {
    throw py::value_error("shuffle and drop_last need dataset= (docs/data.md)");
  }
  return s;
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
        auto s = settingsFrom(options);
        py::gil_scoped_release release;
        startJob(std::move(argv), std::move(s));
      },
      "Starts this process's troupe job with its first stream; returns on the head once its "
      "driver runs, never elsewhere.");
  m.def(
      "check_settings", [](py::dict options) { settingsFrom(options); },
      "Raises TypeError or ValueError, naming it, for an option start() or add_stream() would "
      "refuse.");
  m.def(
      "add_stream",
      [](py::dict options) -> uint32_t {
        auto s = settingsFrom(options);
        if (localFd >= 0) {
          // A local rank's process: the stream's batches come from its troupe process.
          uint32_t number = localStreams++;
          setFeed(number, troupe::train::localRankFeed(localFd, number));
          return number;
        }
        py::gil_scoped_release release;
        return addStream(std::move(s));
      },
      "A later stream of this process (a DataLoader after the first): its number. On the head "
      "its actors are placed now.");
  m.def(
      "set_fork_server",
      [](int fd) {
        troupe::train::setForkServer(fd);
        // This process's augmenters of a DataLoader get their batches from its workers.
        troupe::train::setBatchMaker(std::make_shared<troupe::train::ProcessBatchMaker>());
      },
      py::arg("fd"),
      "The fork server of this process's DataLoader workers (python/troupe/_forkserver.py).");
  m.def(
      "image_seed",
      [](uint64_t seed, uint64_t epoch, uint64_t index) {
        return troupe::data::mixSeed(seed, epoch, index);
      },
      py::arg("seed"), py::arg("epoch"), py::arg("index"),
      "An ImageDataset(seed=)'s item's seed, as the data group's transforms draw it.");
  m.def(
      "sample_seed",
      [](uint64_t base, uint64_t position) { return troupe::data::sampleSeed(base, position); },
      py::arg("base"), py::arg("position"),
      "The seed of the random draws of the sample at `position` of a pass of base seed `base`.");
  m.def("placements", []() { return jobPlacements(); });
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
      "rank_share",
      [](py::array_t<uint32_t, py::array::c_style> order, uint32_t batchSize, bool dropLast,
         uint32_t rank, uint32_t ranks) {
        // DDP rank `rank` of `ranks`' share of a pass whose whole order is `order`, as
        // troupe/dataset/epoch.h's BatchedEpoch cuts it: the same number of batches each.
        troupe::data::BatchedEpoch plan{uint64_t(order.size()), batchSize, false, dropLast, rank,
                                        ranks};
        try {
          plan.check();
        } catch (const troupe::data::DatasetError& e) {
          throw py::value_error(e.what());
        }
        std::span<const uint32_t> all(order.data(), order.size());
        auto mine = ranks > 1 ? plan.share(all) : std::vector<uint32_t>(all.begin(), all.end());
        mine.resize(plan.used());
        py::array_t<uint32_t> out(static_cast<py::ssize_t>(mine.size()));
        std::copy(mine.begin(), mine.end(), out.mutable_data());
        return out;
      },
      py::arg("order"), py::arg("batch_size"), py::arg("drop_last"), py::arg("rank"),
      py::arg("ranks"),
      "The rank's sample ids of a pass (its batches every batch_size, the last short): of one "
      "rank every sample, without the dropped ones.");
  m.def(
      "rank",
      []() {
        // This process's place in a DDP job, as torchrun would have put it in the environment.
        troupe::train::ScriptLearner::Rank r;
        {
          py::gil_scoped_release release;
          r = feed(0).rank();
        }
        py::dict d;
        d["RANK"] = r.rank;
        d["WORLD_SIZE"] = r.ranks;
        d["LOCAL_RANK"] = r.localRank;
        d["LOCAL_WORLD_SIZE"] = r.localRanks;
        d["MASTER_ADDR"] = r.masterAddr;
        d["MASTER_PORT"] = r.masterPort;
        d["SEED"] = r.seed;
        return d;
      },
      "This process's rank in the job (after start()): RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.");
  m.def(
      "serve_local",
      [](uint32_t localRank, int fd, int pid) {
        // The instance's troupe process: local rank `localRank`'s process, at the other end of
        // `fd`, gets the batches of each stream from that rank's trainer in this process.
        troupe::train::serveLocalRank(
            fd, pid, localRank, [](uint32_t stream, troupe::train::StepBatch& b) {
              if (auto* f = formatOf(stream); f != nullptr && f->source) datasetTensors(b, *f);
            });
      },
      py::arg("local_rank"), py::arg("fd"), py::arg("pid"));
  m.def(
      "connect_local",
      [](int fd, int parent) {
        // A local rank's process: its batches come from the instance's troupe process `parent`,
        // served at the other end of `fd`; it never outlives that process.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);  // it has already ended
        localFd = fd;
        localStreams = 1;
        setFeed(0, troupe::train::localRankFeed(fd, 0));
      },
      py::arg("fd"), py::arg("parent"));
  m.def(
      "begin", [](uint32_t stream) { feed(stream).begin(); }, py::arg("stream") = 0);
  m.def(
      "begin_pass",
      [](uint32_t stream, uint32_t pass, py::array_t<uint32_t, py::array::c_style> ids,
         py::array_t<uint32_t, py::array::c_style> ends, uint64_t baseSeed, uint32_t label,
         std::optional<py::array_t<uint64_t, py::array::c_style>> places, py::bytes update) {
        troupe::train::PassPlan plan;
        plan.ids.assign(ids.data(), ids.data() + ids.size());
        plan.ends.assign(ends.data(), ends.data() + ends.size());
        plan.baseSeed = baseSeed;
        plan.label = label;
        if (places) {
          if (size_t(places->size()) != plan.ids.size())
            throw py::value_error("begin_pass: a place for each id, or none");
          plan.places.assign(places->data(), places->data() + places->size());
        }
        plan.update = std::string(update);
        uint32_t last = 0;
        for (auto end : plan.ends) {
          if (end <= last || end > plan.ids.size())
            throw py::value_error("begin_pass: batch ends must ascend within the plan");
          last = end;
        }
        if (last != plan.ids.size()) throw py::value_error("begin_pass: the last batch must end the plan");
        py::gil_scoped_release release;
        feed(stream).beginPass(pass, std::move(plan));
      },
      py::arg("stream"), py::arg("pass_"), py::arg("ids"), py::arg("ends"), py::arg("base_seed"),
      py::arg("label"), py::arg("places") = py::none(), py::arg("update") = py::bytes(),
      "Pass `pass_` of the stream, as the script's iter() planned it: its sample ids by position, "
      "where each batch ends, torch's base seed, the script's epoch, (DDP) each position's "
      "place in the whole pass of every rank, which seeds its sample's draws, and the Dataset's "
      "changed attributes, pickled.");
  m.def(
      "handoffs",
      [](uint32_t stream) {
        auto h = feed(stream).handoffs();
        return py::make_tuple(h.count, h.seconds);
      },
      py::arg("stream") = 0,
      "(batches, seconds): the handoffs so far, from asking for a batch that was already queued "
      "to holding it as arrays.");
  m.def(
      "abandon",
      [](uint32_t stream, uint32_t epoch) {
        py::gil_scoped_release release;
        feed(stream).abandon(epoch);
      },
      py::arg("stream"), py::arg("epoch"),
      "The script left `epoch` (a break): what is not handed over yet is not trained on, and not "
      "made.");
  m.def(
      "next",
      [](uint32_t stream, bool normalize, double timeout) -> py::tuple {
        ScriptLearner::Item item;
        auto asked = std::chrono::steady_clock::now();
        {
          py::gil_scoped_release release;
          item = feed(stream).next(timeout);
        }
        if (item.kind == ScriptLearner::Item::kBatch) {
          bool waited = item.batch.waited;
          auto arrays = batchArrays(item, normalize, stream);
          if (!waited) {
            feed(stream).handedOver(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
          }
          return py::make_tuple(kindName(item.kind), item.epoch, arrays[0], arrays[1], arrays[2]);
        }
        return py::make_tuple(item.timedOut ? "timeout" : kindName(item.kind), item.epoch,
                              item.text, py::none(), py::none());
      },
      py::arg("stream") = 0, py::arg("normalize") = true, py::arg("timeout") = 0.0);
  m.def(
      "peek",
      [](uint32_t stream, double timeout) -> py::tuple {
        ScriptLearner::Peeked peeked;
        {
          py::gil_scoped_release release;
          peeked = feed(stream).peek(timeout);
        }
        return py::make_tuple(peeked.timedOut ? "timeout" : kindName(peeked.kind),
                              peeked.stopping);
      },
      py::arg("stream") = 0, py::arg("timeout") = 0.0,
      "(kind, stopping): waits for the next item (at most `timeout` seconds when above 0: then "
      "'timeout') and says its kind without taking it, and whether the job is stopping. The "
      "batch received before counts as trained.");
  m.def(
      "state",
      [](uint32_t stream) {
        std::string bytes;
        {
          py::gil_scoped_release release;
          bytes = feed(stream).state();
        }
        return py::bytes(bytes);
      },
      py::arg("stream") = 0);
  m.def(
      "load_state",
      [](uint32_t stream, py::bytes bytes, std::string name) {
        auto r = feed(stream).resumeFrom(std::string(bytes), name);
        return py::make_tuple(r.pass, r.planned, r.label);
      },
      py::arg("stream"), py::arg("bytes"), py::arg("name"),
      "(pass, planned, label): the pass a state continues, whether it holds that pass's plan, "
      "and its epoch.");
  m.def(
      "end",
      [](std::string failure) {
        // The job ends now, with `failure` ("" for success). Never returns.
        exiting = true;
        py::gil_scoped_release release;
        endJob(failure);
      },
      py::arg("failure") = "");
  m.def(
      "end_at_exit",
      [](std::string failure, bool stopped, double grace) {
        // Called by the script's last atexit handler: Python finishes exiting as it would (the
        // other handlers, its files flushed, its objects freed), then exit() runs this handler
        // first, registered last, with the process's status, and the job ends with it. A
        // finalisation that hangs (a process group's destructor waiting on a thread) ends the
        // job after `grace` seconds, named.
        scriptFailure = std::move(failure);
        scriptStopped = stopped;
        if (on_exit(endWithStatus, nullptr) != 0) endJob(scriptFailure);
        std::thread([grace]() {
          std::this_thread::sleep_for(std::chrono::duration<double>(grace));
          if (exiting.exchange(true)) return;
          endJob(scriptStopped ? std::string()
                               : "its process did not finish exiting within " +
                                     std::to_string(int(grace)) +
                                     " s of its last line (Python's exit hung: an object's "
                                     "destructor, a thread it joins)");
        }).detach();
      },
      py::arg("failure"), py::arg("stopped"), py::arg("grace") = 60.0,
      "The job ends as the script's process exits, with its exit status.");
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
