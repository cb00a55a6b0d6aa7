// A full disk at each place hetero_train writes (issue 21): the model, the checkpoints and the
// report. On every one the job ends non-zero with a failure file that gives the reason, and no
// partial file is left where it would be shipped as an output. Each disk is a small tmpfs of its
// own (root only; skipped with the reason elsewhere), filled by another writer, as logs or a
// dataset cache fill a real one.

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "harness.h"
#include "train_job.h"

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using harness::headOf;
using harness::readFile;
using harness::rootsOf;
using harness::Run;
using train_job::kCluster;
using train_job::tempPath;
using train_job::train;

namespace {

// A tmpfs of `kib` KiB mounted on a fresh folder, unmounted and removed with this object.
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& name, int kib) : dir_(tempPath(name)) {
    fs::create_directories(dir_);
    if (geteuid() != 0) {
      why_ = "mounting a small tmpfs needs root";
    } else if (mount("tmpfs", dir_.c_str(), "tmpfs", 0,
                     ("size=" + std::to_string(kib) + "k").c_str())) {
      why_ = std::string("mount -t tmpfs failed: ") + strerror(errno);
    } else {
      mounted_ = true;
    }
  }
  ~SmallDisk() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  const std::string& unavailable() const { return why_; }

  // Fills every free block, as another writer would; the free space left (0 when it worked).
  uint64_t fill() {
    int fd = open((dir_ + "/filler").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    std::vector<char> block(4096, 'x');
    while (write(fd, block.data(), block.size()) > 0) {
    }
    while (write(fd, block.data(), 1) > 0) {
    }
    close(fd);
    struct statvfs st {};
    statvfs(dir_.c_str(), &st);
    return uint64_t(st.f_bavail) * st.f_bsize;
  }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

#define SKIP_UNLESS_MOUNTED(disk)                            \
  if (!(disk).unavailable().empty()) {                       \
    WARN("skipping: a full disk: " << (disk).unavailable()); \
    return;                                                  \
  }

}  // namespace

TEST_CASE("a full disk at model save - exit 1, the reason in output/failure, no partial model",
          "[train][disk]") {
  // The instances' roots (model/ and output/) on the small disk, filled once training runs.
  SmallDisk disk("roots", 512);
  SKIP_UNLESS_MOUNTED(disk);
  Run run(harness::sim(
              [&] {
                auto a = kCluster;
                a.insert(a.begin(), "--keep");
                return a;
              }(),
              train({"--epochs", "2", "--train-samples", "4000", "--progress-every", "0.2"})),
          {"TMPDIR=" + disk.dir()});
  REQUIRE_OUTPUT(run, "progress: epoch 1/", 120s);
  CHECK(disk.fill() == 0);
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 1);  // JOB_FAILED, the head's code
  auto roots = rootsOf(run);
  REQUIRE(!roots.empty());
  auto head = headOf(roots);
  REQUIRE(!head.empty());
  for (auto& [host, i] : run.instances()) {
    auto failure = readFile(fs::path(roots) / host / "output" / "failure");
    INFO(host << "'s output/failure: " << failure);
    // Written into the space reserved at start (troupe/sagemaker.h), with the cause and the file.
    CHECK(failure.find("No space left on device") != std::string::npos);
    CHECK(failure.find("model.bin") != std::string::npos);
    CHECK(failure.find("exit code 1 (JOB_FAILED)") != std::string::npos);
    for (auto& f : fs::recursive_directory_iterator(fs::path(roots) / host / "model")) {
      FAIL_CHECK("a partial file is left in " << host << "/model: " << f.path());
    }
    for (auto& f : fs::directory_iterator(fs::path(roots) / host / "output")) {
      CHECK(f.path().extension() != ".tmp");
    }
  }
  CHECK(run.leftovers().empty());
}

TEST_CASE("checkpoints on a full disk - the job fails naming the folder and the cause",
          "[train][disk]") {
  SmallDisk disk("checkpoints", 256);
  SKIP_UNLESS_MOUNTED(disk);
  CHECK(disk.fill() == 0);
  auto report = "/tmp/troupe-disk-test-" + std::to_string(getpid()) + "-failed.json";
  Run run(harness::sim(
      kCluster, train({"--epochs", "2", "--train-samples", "8000", "--checkpoint-dir", disk.dir(),
                       "--checkpoint-every", "25", "--progress-every", "0.1", "--report",
                       report})));
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  // docs/exit-codes.md: one checkpoint that fails is logged; two in a row fail the job (1).
  CHECK(code == 1);
  CHECK(harness::count(out, "checkpoint not written: ") == 2);
  CHECK(out.find("checkpoints cannot be written: 2 failed in a row") != std::string::npos);
  CHECK(out.find("No space left on device") != std::string::npos);
  for (auto& f : fs::directory_iterator(disk.dir())) {
    CHECK(f.path().filename() == "filler");  // no partial checkpoint
  }
  CHECK(run.leftovers().empty());
  // A failed job's report (docs/hetero_train.md, "Reports"): its code and reason, how far it
  // trained (the trainer failed at its second checkpoint), and no checkpoint to resume.
  std::ifstream in(report);
  REQUIRE(in.good());
  auto j = nlohmann::json::parse(in);
  INFO(j.dump(2));
  CHECK(j["exit_status"] == 1);
  CHECK(j["exit_code_name"] == "JOB_FAILED");
  CHECK(j["finished"] == false);
  CHECK(j["reason"].get<std::string>().find("checkpoints cannot be written") != std::string::npos);
  CHECK(j["checkpoint"]["path"].is_null());
  CHECK(j["checkpoint"]["why"] == "no checkpoint was written");
  CHECK(j["epochs"].empty());
  REQUIRE(j["progress"].is_object());
  CHECK(j["progress"]["epoch"] == 1);
  // Failed at step 50 of 62 (the second checkpoint, every 25), past a progress sample (every
  // 0.1 s). With a checkpoint every 10 steps and a sample every 0.2 s, an idle machine reached
  // step 20 before the first sample, 1 run in 4.
  CHECK(j["progress"]["step"].get<uint64_t>() > 0);
  unlink(report.c_str());
}

TEST_CASE("the report on a full disk - exit 1 naming the report's path", "[train][disk]") {
  SmallDisk disk("report", 64);
  SKIP_UNLESS_MOUNTED(disk);
  CHECK(disk.fill() == 0);
  auto report = disk.dir() + "/report.json";
  Run run(harness::sim(kCluster,
                       train({"--epochs", "1", "--train-samples", "2000", "--report", report})));
  int code = run.wait(180s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 1);
  CHECK(out.find(report) != std::string::npos);
  CHECK(out.find("No space left on device") != std::string::npos);
  CHECK(!fs::exists(report));
  CHECK(run.leftovers().empty());
}

TEST_CASE("troupe sim --out on a full disk - exit 1, no partial copy", "[train][disk]") {
  SmallDisk disk("out", 64);
  SKIP_UNLESS_MOUNTED(disk);
  CHECK(disk.fill() == 0);
  auto out = disk.dir() + "/kept";
  auto args = kCluster;
  args.insert(args.begin(), {"--out", out});
  Run run(harness::sim(args, train({"--epochs", "1", "--train-samples", "2000"})));
  int code = run.wait(180s);
  auto text = run.output();
  INFO(text);
  // The job succeeded, but its outputs (the model) are lost: a failed job, as on SageMaker when
  // the upload fails (docs/exit-codes.md).
  CHECK(code == 1);
  CHECK(text.find("the outputs could not be kept in " + out) != std::string::npos);
  CHECK(text.find("No space left on device") != std::string::npos);
  CHECK(!fs::exists(out + "/model"));
  CHECK(run.leftovers().empty());
}
