// File: troupe/sagemaker.h
//
// The SageMaker training environment of this process: the files SageMaker lays out under
// /opt/ml on every instance of a training job, read the same way on SageMaker, under
// `troupe sim`, and in tests.
//
//   /opt/ml/input/config/resourceconfig.json    the cluster (troupe/config.h reads it)
//   /opt/ml/input/config/hyperparameters.json   {"epochs": "3", "layers": "[256,128]", ...}
//   /opt/ml/input/data/<channel>/                one folder per input channel; troupe-secret
//                                                holds the job secret (troupe/secret.h)
//   /opt/ml/model/                               what the job saves; uploaded as model.tar.gz
//   /opt/ml/output/                              `failure` (the FailureReason) and `success`
//   /opt/ml/checkpoints/                         with checkpoint_s3_uri (managed spot training):
//                                                synced to S3 while the job runs, and back
//                                                before it starts again after an interruption
//
// The root is /opt/ml unless TROUPE_SM_ROOT names another; `troupe sim` gives every simulated
// instance its own root this way, so a local run takes the code paths a SageMaker run takes.
//
// troupe::run() loads the environment once and hands it to the driver and to every actor; no
// global holds it:
//
//   auto& sm = job.sagemaker();                         // or sagemaker() inside an actor
//   int epochs = sm.getInt("epochs", 10);               // "3" on the wire, 3 here
//   auto dir = sm.channelDir("train");                  // /opt/ml/input/data/train
//   save(sm.modelDir() + "/model.bin");
//
// In main(), before run(), an app that derives its flags from it reads it itself:
// `auto sm = troupe::SageMakerEnv::detect();`.
//
// On a developer machine without SageMaker files the environment is inactive: no
// hyperparameters, no channels, and run() writes no outcome files.

#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

class SageMakerEnv {
 public:
  static std::string defaultRoot();
  // $TROUPE_SM_ROOT when set and not empty, else "/opt/ml".

  static SageMakerEnv load(const std::string& root);
  // Reads `root`'s hyperparameters.json (a missing file means no hyperparameters) and lists its
  // channels. Throws ConfigError naming the file when hyperparameters.json cannot be read, is not
  // JSON or is not a JSON object. The result is active().

  static SageMakerEnv inactive();
  // The environment of a process that does not run under SageMaker: nothing in it.

  static SageMakerEnv detect();
  // The environment of this process as its files say now: load(defaultRoot()) when detected(),
  // else inactive(). Throws ConfigError as load() does. Reads the files on each call (nothing is
  // cached): troupe::run() calls it once and passes the result on (Driver::sagemaker(),
  // ActorBase::sagemaker()).
  static bool detected();
  // Whether this process runs under a SageMaker-shaped root: TROUPE_SM_ROOT is set, or
  // /opt/ml/input/config/resourceconfig.json exists. Reads no file, so it cannot fail
  // (configError() uses it to decide where to write output/failure).

  bool active() const { return active_; }
  // Whether this process runs under a SageMaker-shaped root: run() then writes output/failure or
  // output/success when the process ends.
  const std::string& root() const { return root_; }
  std::string path(const std::string& relative) const { return root_ + "/" + relative; }
  std::string resourceConfigPath() const { return path("input/config/resourceconfig.json"); }
  std::string hyperparametersPath() const { return path("input/config/hyperparameters.json"); }
  std::string modelDir() const { return path("model"); }
  std::string checkpointDir() const { return path("checkpoints"); }
  // SageMaker's default checkpoint_local_path; it exists only when the job has checkpoints.
  std::string outputDir() const { return path("output"); }
  std::string outputDataDir() const { return path("output/data"); }

  // -- hyperparameters --
  // SageMaker passes every value as a string; like sagemaker-training, each is JSON-decoded when
  // it parses ("3" -> 3, "[1,2]" -> a list, "true" -> true) and stays a string otherwise ("abc").
  // The getters below read the decoded value and throw ConfigError naming the file, the key and
  // the value when it has another type.

  bool has(const std::string& key) const { return raw_.count(key) != 0; }
  std::vector<std::string> keys() const;  // sorted
  std::optional<std::string> raw(const std::string& key) const;
  // The value as SageMaker wrote it (a JSON value that is not a string: its JSON text).
  std::string getJson(const std::string& key) const;
  // The decoded value as JSON text ("3", "[1,2]", "\"abc\""); "null" when the key is absent.
  std::string getString(const std::string& key, const std::string& fallback = "") const;
  // A string value as it is; a number, list or object as its JSON text.
  int64_t getInt(const std::string& key, int64_t fallback = 0) const;
  double getDouble(const std::string& key, double fallback = 0) const;
  bool getBool(const std::string& key, bool fallback = false) const;
  std::vector<std::string> getStrings(const std::string& key) const;
  // A list ("[\"a\",\"b\"]" or ["a","b"]): its elements as getString would give them. A single
  // value gives a list of one; an absent key an empty list.

  // -- channels --
  const std::vector<std::string>& channels() const { return channels_; }
  // The input channels: the entries of input/data (sorted), but troupe's own troupe-secret (the
  // job secret, troupe/secret.h). A `troupe sim --channel` channel is a symbolic link; on
  // SageMaker a folder (File mode) or a FIFO (Pipe mode).
  bool hasChannel(const std::string& name) const;
  std::string channelDir(const std::string& name) const;
  // input/data/<name>. Throws ConfigError naming the channels there when there is no such one.

 private:
  bool active_ = false;
  std::string root_ = "/opt/ml";
  std::string hyperparametersFile_;
  std::map<std::string, std::string> raw_;      // as written
  std::map<std::string, std::string> decoded_;  // JSON text of the decoded value
  std::vector<std::string> channels_;
};

// -- outcome files --
// troupe::run() writes one of them when the process ends under a SageMaker-shaped root.

bool writeFailureFile(const std::string& outputDir, const std::string& reason,
                      const std::string& details);
// Writes `outputDir`/failure (outputDir: SageMakerEnv::outputDir()): `reason` first, made one
// line, as SageMaker shows the file's first 1024 characters as the job's FailureReason; then
// `details`. Removes a stale `success`. Returns false when the file cannot be written.
bool writeSuccessFile(const std::string& outputDir, const std::string& reason);
// Writes `outputDir`/success with `reason`, and removes a stale `failure`.
bool reserveOutcomeSpace(const std::string& outputDir);
// Allocates `outputDir`/.troupe-outcome (64 KiB) for the outcome file to be written into, so
// that a disk that fills up during the job (a checkpoint, the model) still gets its failure file
// with the reason. troupe::run() calls it at start under a SageMaker root. False when the space
// cannot be allocated (the outcome file is then written the ordinary way).

}  // namespace troupe
