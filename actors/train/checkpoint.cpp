// The trainer's checkpoint files (checkpoint.h): writing, listing and reading them.

#include "troupe/train/checkpoint.h"

#include <cmath>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>

namespace troupe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'C', 'K'};
constexpr uint32_t kVersion = 1;
static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian");

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T get(const std::string& in, size_t at) {
  T value;
  memcpy(&value, in.data() + at, sizeof(value));
  return value;
}

uint32_t crc(const char* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(data), size));
}

std::string hex(uint64_t v) {
  char buf[20];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json identityJson(const JobIdentity& id) {
  return {{"train_samples", id.trainSamples},
          {"batch_size", id.batchSize},
          {"layer_sizes", id.layerSizes},
          {"seed", id.seed},
          {"epochs", id.epochs},
          {"learning_rate", id.learningRate},
          {"momentum", id.momentum}};
}

JobIdentity identityFrom(const json& j) {
  JobIdentity id;
  id.trainSamples = j.at("train_samples");
  id.batchSize = j.at("batch_size");
  id.layerSizes = j.at("layer_sizes").get<std::vector<int>>();
  id.seed = j.at("seed");
  id.epochs = j.at("epochs");
  id.learningRate = j.at("learning_rate").get<float>();
  id.momentum = j.at("momentum").get<float>();
  return id;
}

json recordJson(const EpochRecord& r) {
  return {{"samples", r.samples},
          {"duplicates", r.duplicates},
          {"missing", r.missing},
          {"rejected", r.rejected},
          {"steps", r.steps},
          {"step_seconds", r.stepSeconds},
          {"step_cpu_seconds", r.stepCpuSeconds},
          {"fill_seconds", r.fillSeconds},
          {"wait_seconds", r.waitSeconds},
          {"seconds", r.seconds},
          {"loss", r.loss},
          {"accuracy", r.accuracy},
          {"from_checkpoint", r.fromCheckpoint},
          {"digest", r.digest},
          {"skipped", r.skipped},
          {"abandoned", r.abandoned}};
}

EpochRecord recordFrom(const json& j) {
  EpochRecord r;
  r.samples = j.at("samples");
  r.duplicates = j.at("duplicates");
  r.missing = j.at("missing");
  r.rejected = j.at("rejected");
  r.skipped = j.value("skipped", uint64_t(0));  // absent in older checkpoints
  r.abandoned = j.value("abandoned", uint64_t(0));
  r.steps = j.at("steps");
  r.stepSeconds = j.at("step_seconds");
  r.stepCpuSeconds = j.value("step_cpu_seconds", 0.0);  // absent in older checkpoints
  r.fillSeconds = j.value("fill_seconds", 0.0);
  r.waitSeconds = j.at("wait_seconds");
  r.seconds = j.at("seconds");
  // NaN (a learner that does not measure it: a script) is written as null.
  auto number = [&j](const char* key) {
    auto& v = j.at(key);
    return v.is_null() ? std::nan("") : v.get<double>();
  };
  r.loss = number("loss");
  r.accuracy = number("accuracy");
  r.fromCheckpoint = j.at("from_checkpoint");
  r.digest = j.value("digest", uint64_t(0));  // absent in older checkpoints: see restore()
  return r;
}

std::string utcNow(const char* format) {
  char buf[32];
  time_t now = time(nullptr);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path.string() + ": cannot be read (" + strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void syncFolder(const fs::path& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  fsync(fd);  // the rename itself is durable only once the folder is
  close(fd);
}

const std::regex& checkpointName() {
  static const std::regex name(R"(checkpoint-(\d{10})\.troupe)");
  return name;
}

}  // namespace

// -- JobIdentity --

uint64_t JobIdentity::hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const void* data, size_t size) {
    auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  mix(&trainSamples, sizeof(trainSamples));
  mix(&batchSize, sizeof(batchSize));
  uint64_t layers = layerSizes.size();
  mix(&layers, sizeof(layers));
  for (int s : layerSizes) mix(&s, sizeof(s));
  mix(&seed, sizeof(seed));
  mix(&epochs, sizeof(epochs));
  mix(&learningRate, sizeof(learningRate));
  mix(&momentum, sizeof(momentum));
  return h;
}

std::string JobIdentity::differences(const JobIdentity& job) const {
  std::vector<std::string> out;
  auto differ = [&](const char* what, const std::string& mine, const std::string& theirs) {
    if (mine != theirs)
      out.push_back(std::string(what) + " " + mine + " in the checkpoint, " + theirs +
                    " in this job");
  };
  auto layers = [](const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "-" : "") + std::to_string(v[i]);
    return s;
  };
  auto real = [](float v) { return json(v).dump(); };
  differ("train samples", std::to_string(trainSamples), std::to_string(job.trainSamples));
  differ("batch size", std::to_string(batchSize), std::to_string(job.batchSize));
  differ("layer sizes", layers(layerSizes), layers(job.layerSizes));
  differ("seed", std::to_string(seed), std::to_string(job.seed));
  differ("epochs", std::to_string(epochs), std::to_string(job.epochs));
  differ("learning rate", real(learningRate), real(job.learningRate));
  differ("momentum", real(momentum), real(job.momentum));
  std::string text;
  for (size_t i = 0; i < out.size(); ++i) text += (i ? "; " : "") + out[i];
  return text;
}

// -- the file --

std::string encodeCheckpoint(const TrainingState& s) {
  json history = json::array();
  for (auto& h : s.history) history.push_back(recordJson(h));
  json header = {{"format", "troupe hetero_train checkpoint"},
                 {"identity", identityJson(s.identity)},
                 {"identity_hash", hex(s.identity.hash())},
                 {"epoch", s.epoch},
                 {"steps", s.steps},
                 {"acked", s.acked},
                 {"current", recordJson(s.current)},
                 {"history", history},
                 {"parameters", s.parameters.size()},
                 {"velocities", s.velocities.size()},
                 {"seen", s.seen.size()},
                 {"plan_ids", s.plan ? s.plan->ids.size() : 0},
                 {"plan_ends", s.plan ? s.plan->ends.size() : 0},
                 {"plan_places", s.plan ? s.plan->places.size() : 0},
                 {"plan_update", s.plan ? s.plan->update.size() : 0},
                 {"plan_base_seed", s.plan ? s.plan->baseSeed : 0},
                 {"plan_label", s.plan ? s.plan->label : 0},
                 {"planned", s.plan.has_value()},
                 {"written_by", s.writtenBy},
                 {"written_at", utcNow("%Y-%m-%dT%H:%M:%SZ")}};
  std::string text = header.dump();
  std::string out;
  out.reserve(sizeof(kMagic) + 8 + text.size() + 4 * (s.parameters.size() + s.velocities.size()) +
              s.seen.size() + 4 +
              (s.plan ? 4 * (s.plan->ids.size() + s.plan->ends.size()) +
                            8 * s.plan->places.size() + s.plan->update.size()
                      : 0));
  out.append(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(text.size()));
  out += text;
  out.append(reinterpret_cast<const char*>(s.parameters.data()), s.parameters.size() * 4);
  out.append(reinterpret_cast<const char*>(s.velocities.data()), s.velocities.size() * 4);
  out.append(reinterpret_cast<const char*>(s.seen.data()), s.seen.size());
  if (s.plan) {
    out.append(reinterpret_cast<const char*>(s.plan->ids.data()), s.plan->ids.size() * 4);
    out.append(reinterpret_cast<const char*>(s.plan->ends.data()), s.plan->ends.size() * 4);
    out.append(reinterpret_cast<const char*>(s.plan->places.data()), s.plan->places.size() * 8);
    out += s.plan->update;
  }
  put<uint32_t>(out, crc(out.data(), out.size()));
  return out;
}

TrainingState decodeCheckpoint(const std::string& bytes, const std::string& name) {
  constexpr size_t kFixed = sizeof(kMagic) + 4 + 4;
  auto refuse = [&name](const std::string& why) { return CheckpointError(name + ": " + why); };
  if (bytes.size() < kFixed + 4 || memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw refuse(bytes.size() < kFixed + 4 && bytes.size() >= sizeof(kMagic) &&
                         memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0
                     ? "cut short: " + std::to_string(bytes.size()) + " bytes"
                     : "not a troupe checkpoint (no TROUPECK magic)");
  }
  auto version = get<uint32_t>(bytes, sizeof(kMagic));
  if (version != kVersion) {
    throw refuse("format version " + std::to_string(version) + "; this build reads version " +
                 std::to_string(kVersion));
  }
  auto stored = get<uint32_t>(bytes, bytes.size() - 4);
  auto computed = crc(bytes.data(), bytes.size() - 4);
  if (stored != computed) {
    throw refuse("corrupt: checksum mismatch (CRC-32 stored " + hex(stored).substr(8) +
                 ", computed " + hex(computed).substr(8) + "): the file was damaged or cut short");
  }
  auto headerBytes = get<uint32_t>(bytes, sizeof(kMagic) + 4);
  if (kFixed + headerBytes + 4 > bytes.size())
    throw refuse("corrupt: the header runs past the end");
  TrainingState s;
  size_t params = 0, velocities = 0, seen = 0, planIds = 0, planEnds = 0, planPlaces = 0,
         planUpdate = 0;
  try {
    auto header = json::parse(bytes.substr(kFixed, headerBytes));
    s.identity = identityFrom(header.at("identity"));
    if (header.at("identity_hash") != hex(s.identity.hash())) {
      throw refuse("corrupt: the identity hash does not match the identity's fields");
    }
    s.epoch = header.at("epoch");
    s.steps = header.at("steps");
    s.acked = header.at("acked").get<std::vector<uint64_t>>();
    s.current = recordFrom(header.at("current"));
    for (auto& h : header.at("history")) s.history.push_back(recordFrom(h));
    params = header.at("parameters");
    velocities = header.at("velocities");
    seen = header.at("seen");
    if (header.value("planned", false)) {
      // (A state from before plans has none of these: a plan of its own, none.)
      s.plan = PassPlan{};
      planIds = header.at("plan_ids");
      planEnds = header.at("plan_ends");
      planPlaces = header.value("plan_places", size_t(0));
      planUpdate = header.value("plan_update", size_t(0));
      s.plan->baseSeed = header.at("plan_base_seed").get<uint64_t>();
      s.plan->label = header.at("plan_label");
    }
    s.writtenBy = header.value("written_by", "") + ", " + header.value("written_at", "");
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw refuse(std::string("corrupt header: ") + e.what());
  }
  size_t at = kFixed + headerBytes;
  if (params > bytes.size() || velocities > bytes.size() || seen > bytes.size() ||
      planIds > bytes.size() || planEnds > bytes.size() || planPlaces > bytes.size() ||
      planUpdate > bytes.size() ||
      at + 4 * (params + velocities + planIds + planEnds) + 8 * planPlaces + planUpdate + seen +
              4 !=
          bytes.size()) {
    throw refuse("corrupt: " + std::to_string(bytes.size()) + " bytes, the header describes " +
                 std::to_string(at + 4 * (params + velocities + planIds + planEnds) +
                                8 * planPlaces + planUpdate + seen + 4));
  }
  // (A state without a model, a script's, has none: no memcpy from or to a null pointer.)
  s.parameters.resize(params);
  if (params > 0) memcpy(s.parameters.data(), bytes.data() + at, 4 * params);
  at += 4 * params;
  s.velocities.resize(velocities);
  if (velocities > 0) memcpy(s.velocities.data(), bytes.data() + at, 4 * velocities);
  at += 4 * velocities;
  s.seen.assign(bytes.begin() + at, bytes.begin() + at + seen);
  at += seen;
  if (s.plan) {
    s.plan->ids.resize(planIds);
    if (planIds > 0) memcpy(s.plan->ids.data(), bytes.data() + at, 4 * planIds);
    at += 4 * planIds;
    s.plan->ends.resize(planEnds);
    if (planEnds > 0) memcpy(s.plan->ends.data(), bytes.data() + at, 4 * planEnds);
    at += 4 * planEnds;
    if (planPlaces != 0 && planPlaces != planIds) throw refuse("corrupt: the plan's places");
    s.plan->places.resize(planPlaces);
    if (planPlaces > 0) memcpy(s.plan->places.data(), bytes.data() + at, 8 * planPlaces);
    at += 8 * planPlaces;
    s.plan->update.assign(bytes.data() + at, planUpdate);
    uint32_t last = 0;
    for (auto end : s.plan->ends) {
      if (end <= last || end > planIds) throw refuse("corrupt: the plan's batch ends");
      last = end;
    }
    if (last != planIds || s.seen.size() != planIds) {
      throw refuse("corrupt: a plan of " + std::to_string(planIds) + " samples, its batches end at " +
                   std::to_string(last) + ", " + std::to_string(s.seen.size()) + " counted");
    }
  }
  return s;
}

// -- CheckpointDir --

CheckpointDir::CheckpointDir(fs::path dir, unsigned keep)
    : dir_(std::move(dir)), keep_(std::max(1u, keep)) {}

std::vector<fs::path> CheckpointDir::list() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.is_regular_file() &&
        std::regex_match(entry.path().filename().string(), checkpointName())) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());  // the step count is zero-padded: names sort by it
  return out;
}

std::optional<LoadedCheckpoint> CheckpointDir::latest(const JobIdentity& job) const {
  auto files = list();
  if (files.empty()) return std::nullopt;
  auto newest = files.back();
  std::string fresh = "start over with --fresh (it moves every checkpoint of " + dir_.string() +
                      " into a discarded-<time>/ subfolder)";
  std::string problem;
  std::optional<TrainingState> state;
  try {
    state = decodeCheckpoint(readFile(newest), newest.string());
  } catch (const CheckpointError& e) {
    problem = e.what();
  }
  if (state) {
    auto differences = state->identity.differences(job);
    if (differences.empty()) return LoadedCheckpoint{newest, std::move(*state)};
    throw CheckpointError("checkpoint " + newest.string() + " belongs to another job (" +
                          differences + "); run with the checkpoint's settings to resume it, or " +
                          fresh);
  }
  // Damaged: name the newest older one that would resume, if any, so the person can choose.
  std::string older;
  for (size_t i = files.size() - 1; i-- > 0 && older.empty();) {
    try {
      auto s = decodeCheckpoint(readFile(files[i]), files[i].string());
      if (s.identity.differences(job).empty()) older = files[i].filename().string();
    } catch (const CheckpointError&) {
    }
  }
  throw CheckpointError(
      "checkpoint " + problem + "; " +
      (older.empty() ? std::string()
                     : "remove it to resume from the older intact checkpoint " + older + ", or ") +
      fresh);
}

fs::path CheckpointDir::write(const TrainingState& state) {
  fs::create_directories(dir_);
  char name[64];
  snprintf(name, sizeof(name), "checkpoint-%010llu.troupe",
           static_cast<unsigned long long>(state.steps));
  auto final = dir_ / name;
  auto temp = dir_ / (std::string(".") + name + ".tmp");
  auto bytes = encodeCheckpoint(state);
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + temp.string() + ": " + strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int error = errno;
      close(fd);
      unlink(temp.c_str());
      throw std::runtime_error("cannot write " + temp.string() + ": " + strerror(error));
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    int error = errno;
    unlink(temp.c_str());
    throw std::runtime_error("cannot sync " + temp.string() + ": " + strerror(error));
  }
  if (beforeRename_) beforeRename_(temp);
  fs::rename(temp, final);
  syncFolder(dir_);
  auto files = list();
  for (size_t i = 0; i + keep_ < files.size(); ++i) fs::remove(files[i]);
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(dir_, ec)) {
    auto n = entry.path().filename().string();
    if (n.size() > 4 && n.front() == '.' && n.ends_with(".troupe.tmp")) fs::remove(entry, ec);
  }
  return final;
}

std::optional<fs::path> CheckpointDir::setAside() {
  auto files = list();
  if (files.empty()) return std::nullopt;
  auto base = dir_ / ("discarded-" + utcNow("%Y%m%dT%H%M%SZ"));
  auto folder = base;
  for (int i = 2; fs::exists(folder); ++i) folder = base.string() + "-" + std::to_string(i);
  fs::create_directories(folder);
  for (auto& f : files) fs::rename(f, folder / f.filename());
  syncFolder(dir_);
  return folder;
}

}  // namespace troupe::train
