// deploy/sagemaker/train, without a container: against an emulated root, and as the app of
// `troupe sim` (every instance through the entry script, as on SageMaker).
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "deploy_util.h"

using namespace std::chrono_literals;

TEST_CASE("train runs the configured app against an emulated root", "[sagemaker][train]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                              R"({"troupe_app": ")" + deploy::smApp() +
                                  R"(", "epochs": "2", "troupe_log_level": "debug"})");
  harness::Run run({deploy::trainScript(), "train"},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(20s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("NODE algo-1 group=dnn_group type=ml.p3.2xlarge sm=yes epochs=2") !=
        std::string::npos);
  CHECK(out.find("debug") != std::string::npos);  // troupe_log_level -> TROUPE_LOG_LEVEL
  CHECK(out.find(deploy::smApp() + " --epochs 2 on " + root) != std::string::npos);
  CHECK(std::filesystem::exists(root + "/output/success"));
}

TEST_CASE("train writes the failure file when the app cannot start", "[sagemaker][train]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"]})",
                              R"({"troupe_app": "/nonexistent/app"})");
  harness::Run run({deploy::trainScript(), "train"},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(20s) == 2);
  CHECK(roots::firstLine(root + "/output/failure") ==
        "cannot start the app '/nonexistent/app' (hyperparameter troupe_app, or TROUPE_APP): not "
        "an executable file");
}

TEST_CASE("troupe sim runs every instance through train, as SageMaker would",
          "[sagemaker][train][sim]") {
  harness::Run run(
      harness::sim({"--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
                    "--hp", "troupe_app=" + deploy::smApp(), "--hp", "epochs=4"},
                   {deploy::trainScript()}));
  CHECK(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(deploy::count(out, "sm=yes epochs=4") == 3);
  CHECK(deploy::count(out, "train: " + deploy::smApp()) == 3);
  CHECK(run.leftovers().empty());
}

namespace {

// SIGTERM's bit in a /proc/PID/status signal mask line (`SigBlk:`, `ShdPnd:`), or false when
// the process is gone.
bool sigtermIn(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return (std::stoull(line.substr(field.size() + 1), nullptr, 16) >> (SIGTERM - 1)) & 1;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("a SIGTERM before the app takes it waits under hold-signals and stops the job",
          "[sagemaker][train][signals]") {
  // The image's entry point: hold-signals -> train -> the app (deploy/sagemaker/hold_signals.c).
  // The SIGTERM is sent while it is blocked, before the app has a handler; it must stay pending
  // through both execs and stop the job when troupe::run() takes SIGTERM (exit 6 and the failure
  // file), not be lost (the app would run on and exit 0) nor kill the process (no handler yet).
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                              R"({"troupe_app": ")" + deploy::smApp() + R"("})");
  harness::Run run({HOLD_SIGNALS, deploy::trainScript(), "train"},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!sigtermIn(run.pid(), "SigBlk") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  REQUIRE(sigtermIn(run.pid(), "SigBlk"));  // hold-signals has run
  REQUIRE(kill(run.pid(), SIGTERM) == 0);
  bool held = sigtermIn(run.pid(), "ShdPnd");
  INFO("held while blocked: " << held);
  CHECK(run.wait(20s) == 6);  // INTERRUPTED
  auto out = run.output();
  INFO(out);
  CHECK(roots::firstLine(root + "/output/failure").find("SIGTERM") != std::string::npos);
  CHECK(run.leftovers().empty());
}

TEST_CASE("hold-signals writes the failure file when the entry point cannot start",
          "[sagemaker][train][signals]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", "");
  harness::Run run({HOLD_SIGNALS, "/nonexistent/train", "train"}, {"TROUPE_SM_ROOT=" + root});
  CHECK(run.wait(10s) == 2);
  CHECK(roots::firstLine(root + "/output/failure") ==
        "cannot start the entry point '/nonexistent/train': No such file or directory");
}

TEST_CASE("train passes underscore hyperparameters as the app's dashed flags",
          "[sagemaker][train]") {
  // docs/sagemaker.md: `batch_size` or `batch-size`; SageMaker users write underscores.
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                              R"({"troupe_app": ")" HETERO_TRAIN R"(", "epochs": "1",
      "train_samples": "512", "batch_size": "64", "progress-every": "5"})");
  harness::Run run({deploy::trainScript(), "train"},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(60s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("--train-samples 512 --batch-size 64 --progress-every 5") != std::string::npos);
  CHECK(roots::readFile(root + "/output/data/report.json").find("\"batch_size\": 64") !=
        std::string::npos);
}

TEST_CASE("train names a bad hyperparameter and its file, and never logs a secret's value",
          "[sagemaker][train][bad-input]") {
  roots::TempDir dir;
  // "epochs": "two" and a secret under a key troupe does not know (the user's mistake: troupe's
  // own secret comes as the troupe-secret channel).
  auto root = roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                              R"({"troupe_app": ")" HETERO_TRAIN R"(", "epochs": "two",
      "api_token": "s3cr3t-value-that-must-not-be-logged"})");
  harness::Run run({deploy::trainScript(), "train"},
                   {"TROUPE_SM_ROOT=" + root, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(60s) == 2);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("s3cr3t-value") == std::string::npos);
  CHECK(out.find("--api-token '<hidden>'") != std::string::npos);
  auto failure = roots::readFile(root + "/output/failure");
  CHECK(failure.find("s3cr3t-value") == std::string::npos);
  // One bad value at a time: the unknown key is refused first, naming the file; without it,
  // "two" names the hyperparameter and the file.
  CHECK(failure.find("unknown hyperparameter 'api_token' in " + root +
                     "/input/config/hyperparameters.json") != std::string::npos);
  CHECK(failure.find("test-kill-during-checkpoint") == std::string::npos);  // a test-only flag
  roots::TempDir dir2;
  auto root2 = roots::makeRoot(dir2 / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1"],
      "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})",
                               R"({"troupe_app": ")" HETERO_TRAIN R"(", "epochs": "two"})");
  harness::Run run2({deploy::trainScript(), "train"},
                    {"TROUPE_SM_ROOT=" + root2, "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run2.wait(60s) == 2);
  auto failure2 = roots::readFile(root2 + "/output/failure");
  INFO(run2.output());
  CHECK(failure2.find("--epochs") != std::string::npos);
  CHECK(failure2.find("(hyperparameter 'epochs' = 'two' in " + root2 +
                      "/input/config/hyperparameters.json)") != std::string::npos);
}

TEST_CASE("train starts a killed worker again, and says so when its restarts are used up",
          "[sagemaker][train][restarts]") {
  // A stand-in app: writes the role it is given (or none), logs its incarnation, kills itself.
  roots::TempDir dir;
  auto app = dir / "app";
  std::ofstream(app) << "#!/bin/bash\n"
                        "[[ $ROLE == none ]] || echo $ROLE > \"$TROUPE_ROLE_FILE\"\n"
                        "echo \"started incarnation $TROUPE_INCARNATION\"\n"
                        "kill -KILL $$\n";
  std::filesystem::permissions(app, std::filesystem::perms::owner_all);
  std::string root;
  auto start = [&](const std::string& role, const std::string& host) {
    root = roots::makeRoot(dir / host, R"({"current_host": "algo-1", "hosts": ["algo-1"]})",
                           R"({"troupe_app": ")" + app + R"("})");
    std::vector<std::string> argv = {deploy::trainScript(), "train"};
    std::vector<std::string> env = {"TROUPE_SM_ROOT=" + root, "ROLE=" + role};
    return std::make_unique<harness::Run>(argv, env);
  };
  SECTION("a worker: 2 restarts, then a line and output/failure with the host's code") {
    auto run = start("worker", "w");
    CHECK(run->wait(30s) == 137);
    auto out = run->output();
    INFO(out);
    CHECK(deploy::count(out, "started incarnation") == 3);
    CHECK(out.find("app (worker) was killed by SIGKILL; starting it again (restart 2 of 2)") !=
          std::string::npos);
    std::string line = "app (worker) was killed by SIGKILL; no restarts left "
                       "(troupe_node_restarts 2): this host ends 137";
    CHECK(out.find("train: " + line) != std::string::npos);
    CHECK(roots::readFile(root + "/output/failure") ==
          line + "\nexit code 137 (was killed by SIGKILL)\n");
  }
  SECTION("killed before it wrote its role: started again too (nothing hangs on it yet)") {
    auto run = start("none", "n");
    CHECK(run->wait(30s) == 137);
    auto out = run->output();
    INFO(out);
    CHECK(deploy::count(out, "started incarnation") == 3);
    CHECK(out.find("app (killed before it knew its role) was killed by SIGKILL; starting it "
                   "again (restart 1 of 2)") != std::string::npos);
  }
  SECTION("a head: never started again") {
    auto run = start("head", "h");
    CHECK(run->wait(30s) == 137);
    auto out = run->output();
    INFO(out);
    CHECK(deploy::count(out, "started incarnation") == 1);
    CHECK(out.find("no restarts left") == std::string::npos);
  }
  SECTION("a worker SIGTERM killed (a stop that reached the app alone): never started again") {
    // The app starts with SIGTERM blocked (train's hold): it unblocks it, as troupe::run() takes
    // it, and the stop kills it before a handler would.
    std::ofstream(app) << "#!/usr/bin/env python3\n"
                          "import os, signal\n"
                          "open(os.environ['TROUPE_ROLE_FILE'], 'w').write('worker')\n"
                          "print('started incarnation', os.environ['TROUPE_INCARNATION'], "
                          "flush=True)\n"
                          "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
                          "os.kill(os.getpid(), signal.SIGTERM)\n";
    auto run = start("worker", "t");
    CHECK(run->wait(30s) == 143);
    auto out = run->output();
    INFO(out);
    CHECK(deploy::count(out, "started incarnation") == 1);
    CHECK(out.find("starting it again") == std::string::npos);
  }
}
