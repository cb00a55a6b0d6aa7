// SageMakerEnv: hyperparameters decoded like sagemaker-training, channels, outcome files, and the
// errors for bad files (naming the file, the key and the value).
#include <catch2/catch.hpp>

#include "config_error.h"
#include "roots.h"
#include "troupe/config.h"
#include "troupe/sagemaker.h"

using troupe::ConfigError;
using troupe::SageMakerEnv;

namespace {

std::string loadError(const std::string& root) {
  return troupe::testing::configErrorOf([&] { SageMakerEnv::load(root); });
}

}  // namespace

TEST_CASE("hyperparameters: every value a string, JSON-decoded when it parses", "[sagemaker]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", "",
                              R"({"epochs": "3", "layers": "[256, 128]", "name": "abc",
                                  "lr": "0.5", "flag": "true", "py": "True", "obj": "{\"a\": 1}",
                                  "quoted": "\"train.py\"", "plain": 7})");
  auto sm = SageMakerEnv::load(root);
  CHECK(sm.active());
  CHECK(sm.getInt("epochs") == 3);
  CHECK(sm.getJson("epochs") == "3");
  CHECK(sm.raw("epochs") == std::optional<std::string>("3"));
  CHECK(sm.getJson("layers") == "[256,128]");
  CHECK(sm.getStrings("layers") == std::vector<std::string>{"256", "128"});
  CHECK(sm.getString("name") == "abc");
  CHECK(sm.getJson("name") == "\"abc\"");
  CHECK(sm.getDouble("lr") == 0.5);
  CHECK(sm.getBool("flag"));
  CHECK(sm.getBool("py"));
  CHECK(sm.getJson("obj") == R"({"a":1})");
  CHECK(sm.getString("quoted") == "train.py");  // the SDK's sagemaker_program is JSON-quoted
  CHECK(sm.getInt("plain") == 7);               // not a string: taken as it is
  CHECK(sm.getInt("absent", 42) == 42);
  CHECK(sm.getJson("absent") == "null");
  CHECK(sm.keys().size() == 9);
  CHECK(sm.modelDir() == root + "/model");
  CHECK(sm.outputDir() == root + "/output");
}

TEST_CASE("a hyperparameter of the wrong type names the file, the key and the value",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "r", "", R"({"epochs": "abc", "lr": "[1]"})");
  auto sm = SageMakerEnv::load(root);
  CHECK_THROWS_WITH(sm.getInt("epochs"),
                    "hyperparameter 'epochs' in " + root +
                        "/input/config/hyperparameters.json is \"abc\" (a string), not an "
                        "integer; pass an integer");
  CHECK_THROWS_WITH(sm.getDouble("lr"), Catch::Contains("is \"[1]\" (a list), not a number"));
  CHECK_THROWS_WITH(sm.getBool("epochs"), Catch::Contains("not true or false"));
}

TEST_CASE("hyperparameters.json that is not a JSON object is an error naming the file",
          "[sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "r", "", "{\"epochs\": ");
  auto file = root + "/input/config/hyperparameters.json";
  CHECK_THAT(loadError(root),
             Catch::StartsWith("hyperparameters file " + file + " is not valid JSON"));
  roots::writeFile(file, "[\"epochs\", \"3\"]");
  CHECK(loadError(root) == "hyperparameters file " + file +
                               " must hold a JSON object of name -> value, not a list "
                               "([\"epochs\",\"3\"])");
  std::filesystem::remove(file);
  std::filesystem::create_directories(file);
  CHECK_THAT(loadError(root), Catch::Contains("cannot be read: it is a directory"));
  std::filesystem::remove(file);
  CHECK(SageMakerEnv::load(root).keys().empty());  // no file: no hyperparameters
}

TEST_CASE("channels are the entries of input/data, an unknown one names those there",
          "[sagemaker]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "r", "");
  std::filesystem::create_directories(root + "/input/data/train");
  std::filesystem::create_directory_symlink(dir.path(), root + "/input/data/test");
  auto sm = SageMakerEnv::load(root);
  CHECK(sm.channels() == std::vector<std::string>{"test", "train"});
  CHECK(sm.channelDir("train") == root + "/input/data/train");
  CHECK_THROWS_WITH(sm.channelDir("validation"),
                    Catch::Contains("input channel 'validation' is not in " + root +
                                    "/input/data; channels are: test, train"));
}

TEST_CASE("the root is TROUPE_SM_ROOT, else /opt/ml, and detect() reads it", "[sagemaker]") {
  setenv("TROUPE_SM_ROOT", "/tmp/somewhere/", 1);
  CHECK(SageMakerEnv::defaultRoot() == "/tmp/somewhere/");
  unsetenv("TROUPE_SM_ROOT");
  CHECK(SageMakerEnv::defaultRoot() == "/opt/ml");
  CHECK_FALSE(SageMakerEnv::inactive().active());
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "r", "", R"({"epochs": "5"})");
  setenv("TROUPE_SM_ROOT", (root + "/").c_str(), 1);
  auto detected = SageMakerEnv::detect();
  unsetenv("TROUPE_SM_ROOT");
  CHECK(detected.active());
  CHECK(detected.getInt("epochs") == 5);
  CHECK(detected.root() == root);
}

TEST_CASE("outcome files: failure's first line is the reason, made one line", "[sagemaker]") {
  roots::TempDir dir;
  auto output = dir / "output";
  std::string reason = "actor 'trainer' on algo-2 (dnn_group) failed:\nout of memory";
  REQUIRE(troupe::writeFailureFile(output, reason, "exit code 1 (JOB_FAILED) on algo-2"));
  CHECK(roots::firstLine(output + "/failure") ==
        "actor 'trainer' on algo-2 (dnn_group) failed: out of memory");
  CHECK(roots::readFile(output + "/failure").find("exit code 1 (JOB_FAILED)") != std::string::npos);
  REQUIRE(troupe::writeSuccessFile(output, "the driver finished"));
  CHECK(roots::readFile(output + "/success") == "the driver finished\n");
  CHECK_FALSE(std::filesystem::exists(output + "/failure"));
  CHECK_FALSE(troupe::writeSuccessFile("/proc/no-such/output", "x"));
}
