// File: checkpoint.h
//
// hetero_train's checkpoints: everything the trainer needs to continue a job exactly where it
// stopped, after the job was interrupted (a managed spot reclaim: SIGTERM, a new start on new
// capacity, /opt/ml/checkpoints synced back) or its process was killed.
//
// What a checkpoint holds (TrainingState): the model's parameters and the optimiser's momentum,
// the step count (the learning-rate schedule), the epoch in progress, each shard's acknowledged
// position in that epoch's order, which samples the epoch has already trained on (one count per
// sample: the exactly-once check continues across the restart instead of assuming it), the
// epoch's counters so far and the finished epochs' reports. The shuffle and augmentation seeds
// derive from the job's seed (epochOrder(shard, seed, epoch), mixSeed(seed, epoch, position)),
// which the identity records: the same seed gives the same order of every shard on any machine.
//
// The file (little-endian):
//
//   "TROUPECK"  u32 version  u32 header bytes  header (JSON)  sections  u32 CRC-32 of all before
//
// The header names the job (JobIdentity, its fields and their hash) and carries the small state;
// the sections are the parameters, the momentum (float32 each) and the per-sample counts (u8).
// A file with another magic is not a checkpoint; another version, a bad checksum, a short file or
// another job's identity is refused with the reason (CheckpointError), never half-read.
//
// CheckpointDir writes atomically (a temporary file, fsync, rename, fsync of the folder), so an
// interruption at any moment leaves the previous checkpoint usable, and keeps the newest K.

#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::train {

/// A checkpoint that cannot be used: the message names the file and why ("checksum mismatch",
/// "written by another job: batch size 64 there, 128 here").
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The settings a checkpoint must share with the job that resumes it: with any of them
/// different, positions, orders, the schedule or the model's shape would mean something else.
struct JobIdentity {
  uint64_t trainSamples = 0;    ///< Samples per epoch (the dataset size used).
  uint32_t batchSize = 0;       ///< Positions advance in batches of this size.
  std::vector<int> layerSizes;  ///< The model's shape.
  uint64_t seed = 0;            ///< Shuffle, augmentation and initialisation seed.
  uint32_t epochs = 0;          ///< The learning rate decays to 0 over all of them.
  float learningRate = 0;
  float momentum = 0;

  /// FNV-1a over the fields: what the header stores to recognise its job.
  uint64_t hash() const;
  /// "batch size 64 in the checkpoint, 128 in this job; seed 1 in the checkpoint, 42 in this
  /// job"; empty when every field matches. `this` is the checkpoint's.
  std::string differences(const JobIdentity& job) const;
};

/// One epoch's counters (the trainer's report), so far or final.
struct EpochRecord {
  uint64_t samples = 0, duplicates = 0, missing = 0, rejected = 0, steps = 0;
  double stepSeconds = 0, waitSeconds = 0, seconds = 0, loss = 0, accuracy = 0;
  /// CPU seconds of the steps' pool thread (the CPU trainer's compute, without time other
  /// threads of the instance took from it).
  double stepCpuSeconds = 0;
  /// Of waitSeconds: the wait for the epoch's first batch (the pipeline filling).
  double fillSeconds = 0;
  /// Samples of this epoch trained on by earlier runs of the job, before the resume that
  /// continued it (0 for an epoch a single run did).
  uint64_t fromCheckpoint = 0;
  /// The sum (mod 2^64) of sampleDigest(id) over every sample trained on, each time it was: a
  /// checker that knows the epoch's ids computes what it must be (exactly once), without trusting
  /// the counters above (docs/hetero_train.md, "the report").
  uint64_t digest = 0;
  /// Samples that could not be read and were skipped (--skip-bad-samples): neither trained on
  /// nor missing.
  uint64_t skipped = 0;
  /// Samples of an epoch the training script left (a break) that were made but never handed to
  /// it: neither trained on nor missing, and never handed to another epoch.
  uint64_t abandoned = 0;
};

/// splitmix64's finaliser of a sample id: the term of EpochRecord::digest.
inline uint64_t sampleDigest(uint64_t id) {
  uint64_t z = id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A pass that a training script planned (troupe.data.DataLoader: one iter() of its sampler's
/// batches): what its trainer's shards hold, and what its samples' random draws derive from.
struct PassPlan {
  std::vector<uint32_t> ids;   ///< The pass's sample ids, by position.
  std::vector<uint32_t> ends;  ///< Each batch's end (a position), ascending; the last ids.size().
  uint64_t baseSeed = 0;       ///< torch's base_seed of the pass, drawn by the script.
  uint32_t label = 0;          ///< The script's epoch (its set_epoch, or its iterators).
  /// Each position's place in the whole pass, of every DDP rank: what its sample's random draws
  /// derive from (sampleSeed(baseSeed, place)), so that no two ranks draw alike. Empty: the
  /// position itself (one rank).
  std::vector<uint64_t> places;
  /// The attributes of the script's Dataset it changed since it made the DataLoader, pickled
  /// (python/troupe/_workers.py): each worker sets them before it makes the pass's items, as
  /// torch's workers, made again each epoch, see the dataset as it is. Empty: none.
  std::string update;
  uint64_t placeOf(uint64_t position) const {
    return places.empty() ? position : places[position];
  }
};

/// The trainer's state between two steps.
struct TrainingState {
  JobIdentity identity;
  uint32_t epoch = 0;                ///< The epoch in progress; == epochs when all are done.
  uint64_t steps = 0;                ///< Training steps so far, every epoch.
  std::vector<uint64_t> acked;       ///< Per shard: every sample before it was trained on.
  std::vector<uint8_t> seen;         ///< Per sample id (planned: per position): times trained on.
  EpochRecord current;               ///< The epoch in progress, so far.
  std::vector<EpochRecord> history;  ///< Finished epochs.
  std::vector<float> parameters;     ///< trainer::Mlp::parameters().
  std::vector<float> velocities;     ///< trainer::Mlp::velocities(): the optimiser's momentum.
  std::string writtenBy;             ///< Host and reason, for the log ("algo-1, every 100 steps").
  std::optional<PassPlan> plan;      ///< A planned pass in progress: what it makes.
};

/// The bytes of a checkpoint file.
std::string encodeCheckpoint(const TrainingState& state);

/// Reads a checkpoint file's bytes; `name` (the file) goes into error messages. Throws
/// CheckpointError for anything but an intact checkpoint of this format version.
TrainingState decodeCheckpoint(const std::string& bytes, const std::string& name);

/// A checkpoint read from disk and where it came from.
struct LoadedCheckpoint {
  std::filesystem::path path;
  TrainingState state;
};

/// The checkpoint folder: /opt/ml/checkpoints on SageMaker, `--checkpoint-dir` elsewhere.
/// Checkpoints are named checkpoint-<steps, 10 digits>.troupe; everything else in the folder
/// (temporary files of an interrupted write, what --fresh set aside) is not one.
class CheckpointDir {
 public:
  /// `keep`: how many of the newest checkpoints write() leaves (at least 1).
  explicit CheckpointDir(std::filesystem::path dir, unsigned keep = 2);

  const std::filesystem::path& path() const { return dir_; }

  /// The checkpoint files, oldest first. An absent folder has none.
  std::vector<std::filesystem::path> list() const;

  /// The newest checkpoint, if any, checked against `job`. Throws CheckpointError when the newest
  /// is corrupt, of another version or of another job: the message names the file, the reason
  /// and what to do (set it aside with --fresh, or remove it to resume from an older one, which it
  /// names when that one is intact). Never falls back silently: a refused checkpoint is a person's
  /// decision.
  std::optional<LoadedCheckpoint> latest(const JobIdentity& job) const;

  /// Writes `state` as checkpoint-<state.steps>.troupe: to a temporary file in the folder, fsync,
  /// rename over the name, fsync of the folder; then removes the oldest beyond `keep` and stale
  /// temporary files. Creates the folder. Throws std::runtime_error naming the file on an I/O
  /// error (a full disk), leaving the previous checkpoints as they were.
  std::filesystem::path write(const TrainingState& state);

  /// For tests of interrupted writes: called after the temporary file is written and synced,
  /// before the rename.
  void beforeRename(std::function<void(const std::filesystem::path& temp)> hook) {
    beforeRename_ = std::move(hook);
  }

  /// Moves every checkpoint into a new subfolder discarded-<UTC time>/ (nothing is deleted) and
  /// returns it, or nothing when there was none.
  std::optional<std::filesystem::path> setAside();

 private:
  std::filesystem::path dir_;
  unsigned keep_;
  std::function<void(const std::filesystem::path&)> beforeRename_;
};

}  // namespace troupe::train
