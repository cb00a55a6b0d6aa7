// The job secret (troupe/secret.h): where it may come from, the checks on each source, and that it
// leaves no trace in the environment a child inherits.
#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "config_error.h"
#include "temp_dir.h"
#include "troupe/app_settings.h"
#include "troupe/secret.h"

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using troupe::ConfigError;

namespace {

const std::string kGood = "0123456789abcdef0123456789abcdef";  // 32 characters

using TempDir = troupe::testing::TempDir;

std::string write(const std::string& path, const std::string& text, mode_t mode = 0600) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

const auto error = troupe::testing::configErrorOf;

std::string shell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

TEST_CASE("a secret file of mode 0600 or 0400 is read, its trailing newline stripped", "[secret]") {
  TempDir dir;
  CHECK(troupe::readSecretFile(write(dir / "a", kGood + "\n")) == kGood);
  CHECK(troupe::readSecretFile(write(dir / "b", kGood + " \r\n\n", 0400)) == kGood);
}

TEST_CASE("a secret file its group or others can read is refused, naming it, its mode and chmod",
          "[secret]") {
  TempDir dir;
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602}) {
    auto path = write(dir / "s", kGood, mode);
    char octal[8];
    snprintf(octal, sizeof(octal), "%04o", mode);
    INFO(octal);
    CHECK_THAT(error([&] { troupe::readSecretFile(path); }),
               Contains("the secret file '" + path + "'") &&
                   Contains("has mode " + std::string(octal)) &&
                   Contains("run chmod 600 '" + path + "'"));
  }
}

TEST_CASE("a missing, empty or non-file secret file is refused naming it", "[secret]") {
  TempDir dir;
  auto missing = dir / "missing";
  CHECK_THAT(error([&] { troupe::readSecretFile(missing); }),
             Contains("the secret file '" + missing + "'") &&
                 Contains("No such file or directory") && Contains("openssl rand -hex 16"));
  auto empty = write(dir / "empty", "\n");
  CHECK_THAT(error([&] { troupe::readSecretFile(empty); }),
             Contains("the secret file '" + empty + "'") && Contains("is empty"));
  std::filesystem::create_directories(dir / "folder");
  chmod((dir / "folder").c_str(), 0700);
  CHECK_THAT(error([&] { troupe::readSecretFile(dir / "folder"); }),
             Contains("is not a regular file"));
}

TEST_CASE("a secret shorter than 32 characters is refused, naming its length and how to make one",
          "[secret]") {
  TempDir dir;
  auto path = write(dir / "short", "t\n");
  CHECK_THAT(error([&] { troupe::readSecretFile(path); }),
             Equals("the job secret in '" + path +
                    "' has 1 characters; it needs at least 32; make one with: (umask 077; openssl "
                    "rand -hex 16 > secret)"));
  CHECK_THAT(error([&] { troupe::checkSecret(kGood.substr(1), "TROUPE_TOKEN"); }),
             Contains("in TROUPE_TOKEN has 31 characters"));
  CHECK_NOTHROW(troupe::checkSecret(kGood, "TROUPE_TOKEN"));
  CHECK_NOTHROW(troupe::checkSecret(troupe::randomToken(), "randomToken()"));
}

TEST_CASE("a --token argument is refused, naming --token-file", "[secret][settings]") {
  for (std::string arg : {std::string("--token"), "--token=" + kGood}) {
    CHECK_THAT(error([&] { troupe::refuseSecretArgument(arg); }),
               Contains("--token is refused") && Contains("/proc/PID/cmdline") &&
                   Contains("--token-file FILE"));
  }
  CHECK_NOTHROW(troupe::refuseSecretArgument("--token-file"));
  CHECK_NOTHROW(troupe::refuseSecretArgument("--token-file=/s"));
  // An app's parser lets run()'s flags through, but not this one.
  CHECK_THAT(error([] {
               troupe::checkAppArguments({"--token", kGood}, {"--epochs"});
             }),
             Contains("--token is refused"));
  CHECK_NOTHROW(troupe::checkAppArguments({"--token-file", "/s"}, {"--epochs"}));
}

TEST_CASE("TROUPE_TOKEN is taken out of the environment: a child process does not inherit it",
          "[secret]") {
  setenv("TROUPE_TOKEN", kGood.c_str(), 1);
  CHECK(troupe::takeSecretFromEnvironment() == kGood);
  CHECK(getenv("TROUPE_TOKEN") == nullptr);
  auto childEnvironment = shell("env");
  CHECK(childEnvironment.find("PATH=") != std::string::npos);  // the child's environment, read
  CHECK(childEnvironment.find("TROUPE_TOKEN") == std::string::npos);
  CHECK(childEnvironment.find(kGood) == std::string::npos);
  CHECK(troupe::takeSecretFromEnvironment().empty());  // unset: nothing
}

TEST_CASE("the troupe-secret channel holds the secret in one file of any mode, not an app channel",
          "[secret][sagemaker]") {
  TempDir root;
  std::filesystem::create_directories(root / "input/data/train");
  CHECK(troupe::readChannelSecret(troupe::SageMakerEnv::load(root.path())).empty());
  // SageMaker writes the folder; 0644 is what it gives a downloaded file.
  write(root / "input/data/troupe-secret/secret", kGood + "\n", 0644);
  auto env = troupe::SageMakerEnv::load(root.path());
  CHECK(troupe::readChannelSecret(env) == kGood);
  CHECK(env.channels() == std::vector<std::string>{"train"});
  CHECK_FALSE(env.hasChannel("troupe-secret"));

  write(root / "input/data/troupe-secret/other", kGood + "\n");
  CHECK_THAT(error([&] { troupe::readChannelSecret(troupe::SageMakerEnv::load(root.path())); }),
             Contains("the input channel 'troupe-secret' (" + root.path() +
                      "/input/data/troupe-secret) holds 2 files; it must hold one"));
  std::filesystem::remove(root / "input/data/troupe-secret/other");
  write(root / "input/data/troupe-secret/secret", "short\n");
  CHECK_THAT(error([&] { troupe::readChannelSecret(troupe::SageMakerEnv::load(root.path())); }),
             Contains("has 5 characters; it needs at least 32"));
}

TEST_CASE("a troupe_token hyperparameter is refused, pointing to the troupe-secret channel",
          "[secret][sagemaker][settings]") {
  TempDir root;
  write(root / "input/config/hyperparameters.json",
        R"({"troupe_token": ")" + kGood + R"(", "epochs": "1"})");
  auto env = troupe::SageMakerEnv::load(root.path());
  auto message = "hyperparameter 'troupe_token' in " + env.hyperparametersPath() +
                 " is refused: DescribeTrainingJob shows hyperparameters to anyone allowed to "
                 "call it; pass the secret as the input channel 'troupe-secret' "
                 "(deploy/sagemaker/launch.py does) and remove the hyperparameter";
  CHECK_THAT(error([&] { troupe::refuseSecretHyperparameter(env); }), Equals(message));
  // An app checking its hyperparameters says the same, before run().
  CHECK_THAT(error([&] { troupe::checkHyperparameters(env, {"epochs"}); }), Equals(message));
  CHECK_NOTHROW(troupe::refuseSecretHyperparameter(troupe::SageMakerEnv::inactive()));
}

TEST_CASE("writeSecretFile makes a file of mode 0600 whatever was there", "[secret]") {
  TempDir dir;
  auto path = write(dir / "s", "old", 0644);
  auto saved = umask(0);  // even a permissive umask gives 0600
  troupe::writeSecretFile(path, kGood);
  umask(saved);
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(troupe::readSecretFile(path) == kGood);
}
