// The job secret in real processes (troupe/secret.h): a bad source ends the process with
// CONFIG_ERROR (2) and a message naming it and what to do; a running node's environment and
// command line never hold the secret; `troupe sim` keeps it in a 0600 file outside every root.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <regex>

#include "deploy_util.h"

using namespace std::chrono_literals;

namespace {

using deploy::expectConfigError;
using deploy::kTwoHosts;
using deploy::runNode;

std::string procFile(pid_t pid, const char* name) {
  return roots::readFile("/proc/" + std::to_string(pid) + "/" + name);
}

// Every file under `dir` that holds `secret`, but `except`.
std::vector<std::string> filesHolding(const std::string& dir, const std::string& secret,
                                      const std::string& except = "") {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto& entry : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec) || entry.path() == except) continue;
    if (roots::readFile(entry.path()).find(secret) != std::string::npos) {
      found.push_back(entry.path());
    }
  }
  return found;
}

}  // namespace

TEST_CASE("a secret file its group or others can read: exit 2 naming the file, its mode, chmod 600",
          "[secret][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kTwoHosts);
  auto file = dir / "secret";
  roots::writeSecretFile(file, roots::kSecret, 0644);
  expectConfigError(
      runNode(root, {"TROUPE_TOKEN_FILE=" + file}),
      "the secret file '" + file +
          "' (--token-file, TROUPE_TOKEN_FILE) has mode 0644: others than its owner may "
          "read or change it; run chmod 600 '" +
          file + "'");
  roots::writeSecretFile(file, roots::kSecret, 0640);
  expectConfigError(runNode(root, {}, {"--token-file", file}), "has mode 0640");

  auto missing = dir / "missing";
  expectConfigError(
      runNode(root, {"TROUPE_TOKEN_FILE=" + missing}),
      "the secret file '" + missing + "' (--token-file, TROUPE_TOKEN_FILE) cannot be read");
  roots::writeSecretFile(file, "");
  expectConfigError(runNode(root, {"TROUPE_TOKEN_FILE=" + file}),
                    "' (--token-file, TROUPE_TOKEN_FILE) is empty");
}

TEST_CASE("a secret shorter than 32 characters: exit 2 naming its length and how to make one",
          "[secret][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kTwoHosts);
  expectConfigError(
      runNode(root, {"TROUPE_TOKEN=t"}),
      "the job secret in TROUPE_TOKEN has 1 characters; it needs at least 32; make one "
      "with: (umask 077; openssl rand -hex 16 > secret)");
  auto file = dir / "short";
  roots::writeSecretFile(file, "0123456789abcdef");
  expectConfigError(runNode(root, {"TROUPE_TOKEN_FILE=" + file}),
                    "the job secret in '" + file + "' has 16 characters; it needs at least 32");
  roots::writeChannelSecret(root, "0123456789");
  expectConfigError(runNode(root, {}), "(the troupe-secret channel) has 10 characters");
}

TEST_CASE("no secret, or two: exit 2 saying where a secret goes", "[secret][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kTwoHosts);
  expectConfigError(
      runNode(root, {}),
      "no job secret: give every instance of the job the same secret in a file only its "
      "owner can read, with --token-file FILE or TROUPE_TOKEN_FILE=FILE");
  auto file = dir / "secret";
  roots::writeSecretFile(file);
  expectConfigError(
      runNode(root, {"TROUPE_TOKEN_FILE=" + file, "TROUPE_TOKEN=" + roots::kSecret}),
      "the job secret is given twice, in TROUPE_TOKEN and in the file '" + file + "'");
  roots::writeChannelSecret(root);
  roots::writeFile(root + "/input/data/troupe-secret/more/another", roots::kSecret);
  expectConfigError(runNode(root, {}),
                    "/input/data/troupe-secret) holds 2 files; it must hold one");
}

TEST_CASE("a --token argument: exit 2 naming --token-file, for an app and for troupe sim",
          "[secret][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kTwoHosts);
  roots::writeChannelSecret(root);
  auto message =
      "--token is refused: anyone on this machine can read a command line (ps, /proc/PID/cmdline); "
      "write the secret to a file only you can read and pass its path with --token-file FILE";
  expectConfigError(runNode(root, {}, {"--token", roots::kSecret}), message);
  expectConfigError(runNode(root, {}, {"--token=" + roots::kSecret}), message);

  // An app with a parser of its own (hetero_train) says the same before run().
  harness::Run app({HETERO_TRAIN, "--token", roots::kSecret},
                   {"TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(app.wait(20s) == 2);
  CHECK(app.output().find(message) != std::string::npos);

  harness::Run sim(harness::sim({"--token", roots::kSecret}, {deploy::smApp()}));
  CHECK(sim.wait(20s) == 2);
  INFO(sim.output());
  CHECK(sim.output().find(std::string("troupe sim: ") + message) != std::string::npos);
  CHECK(sim.instances().empty());
}

TEST_CASE("a troupe_token hyperparameter: exit 2 pointing to the troupe-secret channel",
          "[secret][sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kTwoHosts,
                              R"({"troupe_token": ")" + roots::kSecret + R"("})");
  roots::writeChannelSecret(root);
  auto message = "hyperparameter 'troupe_token' in " + root +
                 "/input/config/hyperparameters.json is refused: DescribeTrainingJob shows "
                 "hyperparameters to anyone allowed to call it; pass the secret as the input "
                 "channel 'troupe-secret'";
  expectConfigError(runNode(root, {}), message);
  // deploy/sagemaker/train refuses it before it could become TROUPE_TOKEN.
  harness::Run train({deploy::trainScript()},
                     {"TROUPE_SM_ROOT=" + root, "TROUPE_APP=" + deploy::smApp()});
  CHECK(train.wait(20s) == 2);
  INFO(train.output());
  CHECK(roots::firstLine(root + "/output/failure").find(message) == 0);
  CHECK(train.output().find(roots::kSecret) == std::string::npos);
}

TEST_CASE("TROUPE_TOKEN leaves a running node: its /proc/PID/environ and cmdline hold no secret",
          "[secret][sagemaker]") {
  // Kubernetes' secretKeyRef way: the secret in TROUPE_TOKEN when the process starts.
  const std::string secret = "environment-secret-0123456789abcdef";
  deploy::Cluster cluster({{"data_group", "ml.c5.xlarge"}, {"dnn_group", "ml.p3.2xlarge"}},
                          R"({"hold_ms": "4000"})");
  auto runs = cluster.start({"TROUPE_TOKEN=" + secret});
  for (size_t i = 0; i < runs.size(); ++i) {
    // Every node logged in with it: the driver on the head reached every node's actor.
    if (cluster.hosts[i].group == "dnn_group") REQUIRE_OUTPUT(*runs[i], "PING", 30s);
  }
  for (auto& run : runs) {
    auto environ = procFile(run->pid(), "environ");
    INFO(run->output());
    CHECK(environ.find("TROUPE_SM_ROOT=") != std::string::npos);  // the block was read
    CHECK(environ.find("TROUPE_TOKEN=") == std::string::npos);
    CHECK(environ.find(secret) == std::string::npos);
    CHECK(procFile(run->pid(), "cmdline").find(secret) == std::string::npos);
  }
  for (auto& run : runs) CHECK(run->wait(30s) == 0);
  for (auto& run : runs) CHECK(run->output().find(secret) == std::string::npos);  // nor a log
  for (auto& h : cluster.hosts) CHECK(filesHolding(h.root, secret).empty());
}

TEST_CASE("troupe sim keeps the secret in a 0600 file outside every root, never in a command line",
          "[secret][sim]") {
  harness::Run run(harness::sim({"--group", "data_group=1:ml.c5.xlarge", "--group",
                                 "dnn_group=1:ml.p3.2xlarge", "--hp", "hold_ms=4000"},
                                {deploy::smApp()}));
  REQUIRE_OUTPUT(run, "PING", 30s);
  std::smatch m;
  auto out = run.output();
  INFO(out);
  REQUIRE(std::regex_search(out, m, std::regex(R"(roots in (\S+))")));
  std::string dir = m[1];
  auto file = dir + "/secret";
  struct stat st;
  REQUIRE(stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  auto secret = roots::firstLine(file);
  CHECK(secret.size() == 32);
  auto instances = run.instances();
  REQUIRE(instances.size() == 2);
  for (auto& [host, i] : instances) {
    INFO(host);
    auto root = dir + "/" + host;
    CHECK(file.rfind(root + "/", 0) != 0);  // in no root
    CHECK(filesHolding(root, secret).empty());
    CHECK(procFile(i.pid, "cmdline").find(secret) == std::string::npos);
    auto environ = procFile(i.pid, "environ");
    CHECK(environ.find("TROUPE_TOKEN_FILE=" + file) != std::string::npos);
    CHECK(environ.find("TROUPE_TOKEN=") == std::string::npos);
    CHECK(environ.find(secret) == std::string::npos);
  }
  CHECK(procFile(run.pid(), "cmdline").find(secret) == std::string::npos);
  CHECK(filesHolding(dir, secret, file).empty());
  REQUIRE(run.wait(30s) == 0);
  CHECK(run.output().find(secret) == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(file));  // removed with the job
}

TEST_CASE("troupe sim --token-file: every instance uses that secret, a readable one is refused",
          "[secret][sim]") {
  roots::TempDir dir;
  auto file = dir / "secret";
  roots::writeSecretFile(file);
  harness::Run run(harness::sim({"--token-file", file, "--hp", "hold_ms=2000"}, {deploy::smApp()}));
  REQUIRE_OUTPUT(run, "PING", 30s);
  for (auto& [host, i] : run.instances()) {
    CHECK(procFile(i.pid, "environ").find("TROUPE_TOKEN_FILE=" + file) != std::string::npos);
  }
  CHECK(run.wait(30s) == 0);
  CHECK(std::filesystem::exists(file));  // the caller's: left alone

  chmod(file.c_str(), 0644);
  harness::Run refused(harness::sim({"--token-file", file}, {deploy::smApp()}));
  CHECK(refused.wait(20s) == 2);
  INFO(refused.output());
  CHECK(refused.output().find("troupe sim: the secret file '" + file + "'") != std::string::npos);
  CHECK(refused.output().find("has mode 0644") != std::string::npos);
}
