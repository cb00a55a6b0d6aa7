// SageMaker script mode through deploy/sagemaker/train (issue 48): a script written for script
// mode (tests/python/script_mode/: its own argparse, SM_CHANNEL_TRAIN, SM_MODEL_DIR, a
// requirements.txt) shipped as the SDK ships it, sourcedir.tar.gz named by
// sagemaker_submit_directory, and run by train on every instance of a troupe sim cluster.

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include "pytorch_test.h"

using namespace std::chrono_literals;
using namespace pytorch_test;

namespace {

// A folder for one case: the training channel (rows.csv, 200 rows of y = 3x + 1), the source
// folder's tarball (the test's script, and `requirements` as its requirements.txt) and a venv
// that sees the system's packages (Debian's Python refuses pip installs outside one, PEP 668,
// where SageMaker's images have a pip of their own). Removed at the end.
struct ScriptModeJob {
  std::string dir = tempPath("script-mode");
  std::string channel = dir + "/train";
  std::string tarball = dir + "/sourcedir.tar.gz";
  std::string python = dir + "/venv/bin/python";

  explicit ScriptModeJob(const std::string& requirements) {
    fs::create_directories(channel);
    std::ofstream rows(channel + "/rows.csv");
    for (int i = 0; i < 200; ++i) rows << i / 100.0 << "," << 3 * (i / 100.0) + 1 << "\n";
    auto source = dir + "/source";
    fs::copy(std::string(SCRIPT_MODE_DIR), source);
    std::ofstream(source + "/requirements.txt") << requirements << "\n";
    auto tar = "tar -C " + source + " -czf " + tarball + " .";
    REQUIRE(std::system(tar.c_str()) == 0);
    auto venv = std::string(PYTHON3) + " -m venv --system-site-packages " + dir + "/venv";
    REQUIRE(std::system(venv.c_str()) == 0);
  }
  ~ScriptModeJob() { fs::remove_all(dir); }

  std::vector<std::string> simArgs(const std::string& program) const {
    auto args = kCluster;
    args.insert(args.end(), {"--keep", "--channel", "train=" + channel, "--hp",
                             "sagemaker_program=" + program, "--hp",
                             "sagemaker_submit_directory=file://" + tarball, "--hp", "epochs=2",
                             "--hp", "batch-size=20", "--hp", "troupe_python=" + python});
    return args;
  }
};

// Every instance's output/failure of a run started with --keep (its roots are removed): the
// app never started, so no instance knows it is the head.
std::vector<std::string> failures(Run& run) {
  auto roots = harness::rootsOf(run);
  REQUIRE(!roots.empty());
  std::vector<std::string> all;
  for (auto& entry : fs::directory_iterator(roots))
    if (fs::is_directory(entry.path() / "output"))
      all.push_back(harness::readFile(entry.path() / "output" / "failure"));
  fs::remove_all(roots);
  return all;
}

// pip reaches no index: a requirement the venv already has is met offline, one it lacks fails
// at once (not after pip's retries).
std::vector<std::string> scriptEnv() {
  auto env = pythonEnv();
  env.push_back("PIP_NO_INDEX=1");
  return env;
}

}  // namespace

TEST_CASE("script mode: a script written for SageMaker runs unchanged through "
          "deploy/sagemaker/train under troupe sim, its source fetched and requirements installed "
          "on every instance, the toolkit's SM_* variables and command line",
          "[pytorch][sagemaker][script-mode]") {
  SKIP_WITHOUT_TORCH();
  ScriptModeJob job("numpy");
  Run run(harness::sim(job.simArgs("train.py"), {TRAIN_SCRIPT}), scriptEnv());
  int code = run.wait(240s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("troupe sim: all 3 instances exited 0") != std::string::npos);
  // Every instance fetched the source and installed its requirements, then ran the script with
  // the user's hyperparameters as the toolkit passes them, and nothing of troupe's.
  CHECK(harness::count(out, "train: script mode: train.py (unpacked from " + job.tarball +
                                ", requirements.txt installed)") == 3);
  CHECK(harness::count(out, "/code/train.py --batch-size 20 --epochs 2 on ") == 3);
  CHECK(out.find("--troupe_python") == std::string::npos);
  // The head trained every sample once an epoch, found its channel and model folder through
  // SM_*, and ran in its code folder.
  CHECK(out.find("script-mode epoch 1: 200 samples, 200 distinct of 200") != std::string::npos);
  CHECK(out.find(R"("SM_CURRENT_INSTANCE_GROUP": "dnn_group")") != std::string::npos);
  CHECK(out.find(R"("SM_HP_EPOCHS": "2")") != std::string::npos);
  CHECK(out.find(R"("SM_USER_ARGS": "[\"--batch-size\",\"20\",\"--epochs\",\"2\"]")") !=
        std::string::npos);
  CHECK(out.find(R"("SM_MODULE_NAME": "train")") != std::string::npos);
  CHECK(out.find("script-mode args: epochs 2, batch size 20, lr 0.1, cwd ") != std::string::npos);
  auto roots = harness::rootsOf(run);
  REQUIRE(!roots.empty());
  auto head = harness::headOf(roots);
  CHECK(fs::exists(roots + "/" + head + "/model/model.pt"));
  CHECK(fs::exists(roots + "/" + head + "/code/requirements.txt"));
  fs::remove_all(roots);
  CHECK(run.leftovers().empty());
}

// A script-mode job that cannot start: every instance exits 2, each output/failure holding every
// one of `says`.
static void checkRefused(const std::string& requirements, const std::string& program,
                  const std::vector<std::string>& says) {
  ScriptModeJob job(requirements);
  Run run(harness::sim(job.simArgs(program), {TRAIN_SCRIPT}), scriptEnv());
  int code = run.wait(240s);
  auto out = run.output();
  INFO(out);
  CHECK(code == 2);
  CHECK(harness::count(out, " exited with 2") == 3);
  auto all = failures(run);
  CHECK(all.size() == 3);
  for (auto& failure : all) {
    INFO("output/failure: " << failure);
    for (auto& text : says) CHECK(failure.find(text) != std::string::npos);
  }
  CHECK(run.leftovers().empty());
}

// Each its own case, so each has ctest's whole timeout: on a loaded machine (the image built beside
// the suite) the three instances' pip runs, one at a time on the shared venv, took minutes.
TEST_CASE("script mode: a requirement pip cannot install - every instance exits 2 and its "
          "output/failure names the package and pip's error",
          "[pytorch][sagemaker][script-mode][bad-input]") {
  SKIP_WITHOUT_TORCH();
  checkRefused("troupe-no-such-package==1.0", "train.py",
               {"script mode: ",
                "/code/requirements.txt: pip install -r requirements.txt exited 1: ERROR: ",
                "troupe-no-such-package==1.0"});
}

TEST_CASE("script mode: an entry point the source folder lacks - every instance exits 2 and its "
          "output/failure names it and what the folder has",
          "[pytorch][sagemaker][script-mode][bad-input]") {
  SKIP_WITHOUT_TORCH();
  // A requirement pip cannot install: the entry point is checked first, so pip never runs.
  checkRefused("troupe-no-such-package==1.0", "trian.py",
               {"hyperparameter sagemaker_program 'trian.py': no such file in the source "
                "folder ",
                "(it has: requirements.txt, train.py); did you mean train.py?"});
}
