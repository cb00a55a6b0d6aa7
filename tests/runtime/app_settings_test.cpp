// An app's flags and hyperparameters beside troupe::run()'s: unknown ones are errors naming the
// nearest known one (troupe/app_settings.h, troupe/cli11.h).
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "config_error.h"
#include "temp_dir.h"
#include "troupe/app_settings.h"
#include "troupe/cli11.h"
#include "troupe/run.h"

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using troupe::ConfigError;
using troupe::SageMakerEnv;

namespace {

// A SageMaker-shaped root holding only hyperparameters.json; removed at the end of the test.
class Root {
 public:
  explicit Root(const std::string& hyperparameters) {
    std::filesystem::create_directories(dir_ / "input/config");
    std::ofstream(file()) << hyperparameters;
  }
  SageMakerEnv env() const { return SageMakerEnv::load(dir_.path()); }
  std::string file() const { return dir_ / "input/config/hyperparameters.json"; }

 private:
  troupe::testing::TempDir dir_{"troupe-settings"};
};

const auto error = troupe::testing::configErrorOf;

const std::vector<std::string> kKnown = {"epochs", "batch-size", "lr", "data-dir", "help"};

struct App {
  CLI::App cli{"test app"};
  unsigned epochs = 5;
  unsigned batchSize = 128;
  App() {
    cli.add_option("--epochs", epochs)->check(CLI::Range(1u, 1000u));
    cli.add_option("--batch-size", batchSize);
  }
  void parse(std::vector<std::string> args, const SageMakerEnv& env = SageMakerEnv::inactive()) {
    args.insert(args.begin(), "app");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    troupe::parseAppFlags(cli, static_cast<int>(argv.size()), argv.data(), {}, env);
  }
};

}  // namespace

TEST_CASE("the nearest name is a likely typo, or none", "[settings]") {
  std::vector<std::string> flags = {"--epochs", "--batch-size", "--lr", "--token-file"};
  CHECK(troupe::nearestName("--epohcs", flags) == "--epochs");  // a swap is one edit
  CHECK(troupe::nearestName("--epoch", flags) == "--epochs");
  CHECK(troupe::nearestName("--batchsize", flags) == "--batch-size");
  CHECK(troupe::nearestName("--tokn-file", flags) == "--token-file");
  CHECK(troupe::nearestName("--learning-rate", flags) == "");  // another word, not a typo
  CHECK(troupe::nearestName("--xy", flags) == "");
  CHECK(troupe::nearestName("--epochs", {}) == "");
}

TEST_CASE("run()'s flags are listed with their variables", "[settings]") {
  auto flags = troupe::runFlags();
  auto find = [&](const std::string& name) {
    for (auto& f : flags) {
      if (f.flag == name) return f;
    }
    return troupe::RunFlag{"", "", false};
  };
  CHECK(find("--head-group").variable == "TROUPE_HEAD_GROUP");
  CHECK(find("--cluster").variable == "TROUPE_CLUSTER_FILE");
  CHECK(find("--token-file").variable == "TROUPE_TOKEN_FILE");
  CHECK(find("--token-file").takesValue);
  CHECK(find("--token").flag.empty());  // the secret is never an argument (troupe/secret.h)
  CHECK(find("--troupe-help").flag == "--troupe-help");
  CHECK_FALSE(find("--troupe-help").takesValue);
}

TEST_CASE("leftover arguments must be run()'s flags", "[settings]") {
  std::vector<std::string> app = {"--epochs", "--batch-size", "--help"};
  CHECK_NOTHROW(troupe::checkAppArguments({}, app));
  CHECK_NOTHROW(troupe::checkAppArguments(
      {"--token-file", "f", "--port=7000", "--troupe-help", "--head-group", "dnn_group"}, app));
  CHECK_THAT(error([&] {
               troupe::checkAppArguments({"--epohcs", "1"}, app);
             }),
             Equals("unknown option '--epohcs'; did you mean '--epochs'? (see --help)"));
  CHECK_THAT(error([&] { troupe::checkAppArguments({"--tokn-file=x"}, app); }),
             Equals("unknown option '--tokn-file'; did you mean '--token-file'? (see --help)"));
  CHECK_THAT(error([&] { troupe::checkAppArguments({"--frobnicate"}, app); }),
             Equals("unknown option '--frobnicate' (see --help)"));
  CHECK_THAT(error([&] {
               troupe::checkAppArguments({"--token-file", "f", "stray"}, app);
             }),
             Equals("unexpected argument 'stray' (see --help)"));
}

TEST_CASE("hyperparameters must be the app's settings, SageMaker's or troupe's", "[settings]") {
  Root ok(R"({"epochs": "3", "batch_size": "64", "data-dir": "/x", "sagemaker_program": "train",
              "sagemaker_submit_directory": "s3://b/k", "sagemaker_region": "us-east-1",
              "sagemaker_job_name": "j", "sagemaker_container_log_level": "20",
              "troupe_app": "hetero_train", "troupe_token_file": "/s",
              "troupe_head_group": "g"})");
  CHECK_NOTHROW(troupe::checkHyperparameters(ok.env(), kKnown));
  CHECK_NOTHROW(troupe::checkHyperparameters(SageMakerEnv::inactive(), kKnown));

  Root typo(R"({"epohcs": "3"})");
  CHECK_THAT(
      error([&] { troupe::checkHyperparameters(typo.env(), kKnown); }),
      Equals("unknown hyperparameter 'epohcs' in " + typo.file() + "; did you mean 'epochs'?"));
  // troupe_* is troupe's, never the app's to refuse (deploy/sagemaker/train reads each): one
  // troupe does not read is a warning naming the nearest, one it reads none.
  Root troupeOwn(R"({"troupe_head_grop": "g", "troupe_node_restarts": "2",
                     "troupe_python": "/usr/bin/python3", "troupe_head_group": "g"})");
  CHECK_NOTHROW(troupe::checkHyperparameters(troupeOwn.env(), kKnown));
  auto warnings = troupe::troupeHyperparameterWarnings(troupeOwn.env());
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("hyperparameter 'troupe_head_grop' in " + troupeOwn.file() +
                                   " sets TROUPE_HEAD_GROP, which troupe itself does not read; "
                                   "did you mean 'troupe_head_group'?"));
  Root runOption(R"({"port": "7000"})");
  CHECK_THAT(error([&] { troupe::checkHyperparameters(runOption.env(), kKnown); }),
             Contains("it is troupe's option --port; set it as the hyperparameter 'troupe_port'"));
  Root unknown(R"({"frobnicate": "1"})");
  CHECK_THAT(error([&] { troupe::checkHyperparameters(unknown.env(), kKnown); }),
             Contains("unknown hyperparameter 'frobnicate'") &&
                 Contains("known: epochs, batch_size, lr, data_dir"));
}

TEST_CASE("parseAppFlags: hyperparameters, then the command line, and nothing unknown",
          "[settings]") {
  SECTION("off SageMaker: the command line, run()'s flags left alone") {
    App app;
    app.parse({"--epochs", "3", "--token-file", "f", "--epochs=4"});
    CHECK(app.epochs == 4);  // the last one wins
    App typo;
    CHECK_THAT(error([&] {
                 typo.parse({"--epohcs", "1"});
               }),
               Equals("unknown option '--epohcs'; did you mean '--epochs'? (see --help)"));
    App bad;
    CHECK_THAT(error([&] {
                 bad.parse({"--epochs", "0"});
               }),
               Contains("--epochs") && Contains("0") && Contains("(see --help)"));
  }
  SECTION("on SageMaker: hyperparameters first, flags win") {
    Root root(R"({"epochs": "7", "batch_size": "32", "sagemaker_program": "train"})");
    auto env = root.env();
    App app;
    app.parse({"--batch-size", "16"}, env);
    CHECK(app.epochs == 7);
    CHECK(app.batchSize == 16);
  }
  SECTION("a bad value from a hyperparameter names the key and the file") {
    Root root(R"({"epochs": "abc"})");
    auto env = root.env();
    App app;
    CHECK_THAT(error([&] { app.parse({}, env); }),
               Contains("--epochs") &&
                   Contains("(hyperparameter 'epochs' = 'abc' in " + root.file() + ")"));
    App overridden;  // the command line's value replaces it: no error
    overridden.parse({"--epochs", "2"}, env);
    CHECK(overridden.epochs == 2);
  }
  SECTION("an unknown hyperparameter") {
    Root root(R"({"epohcs": "3"})");
    auto env = root.env();
    App app;
    CHECK_THAT(error([&] { app.parse({}, env); }),
               Contains("unknown hyperparameter 'epohcs'") && Contains("did you mean 'epochs'?"));
  }
}
