// hetero_train's settings under a SageMaker-shaped root and off it: a misspelled flag, an unknown
// hyperparameter and a bad value each end every process with CONFIG_ERROR (2), a message naming
// the thing (and the nearest known name), and under a root output/failure saying the same first.
// SageMaker's own sagemaker_* hyperparameters are accepted. Also a --head-group that names no
// group.
#include <chrono>

#include "deploy_util.h"

using namespace std::chrono_literals;

namespace {

const char* kOne = R"({"current_host": "algo-1", "hosts": ["algo-1"],
  "current_group_name": "dnn_group", "current_instance_type": "ml.p3.2xlarge"})";

// SageMaker adds these to every job's hyperparameters.json; they must never be an error.
const char* kSageMakers = R"("sagemaker_program": "train", "sagemaker_submit_directory":
  "s3://bucket/source.tar.gz", "sagemaker_region": "us-east-1", "sagemaker_job_name": "job-1",
  "sagemaker_container_log_level": "20")";

struct Result {
  int code;
  std::string output, failure;
};

Result runTrain(const std::vector<std::string>& args, const std::string& root = "") {
  std::vector<std::string> argv = {HETERO_TRAIN};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = {"TROUPE_PORT=" + std::to_string(deploy::freePort())};
  if (!root.empty()) env.push_back("TROUPE_SM_ROOT=" + root);
  harness::Run run(argv, env);
  Result r;
  r.code = run.wait(30s);
  r.output = run.output();
  if (!root.empty()) r.failure = roots::firstLine(root + "/output/failure");
  CHECK_FALSE(harness::processExists(run.pid()));
  return r;
}

std::string hyperparameters(const std::string& own) {
  return "{" + own + (own.empty() ? "" : ", ") + kSageMakers + "}";
}

}  // namespace

TEST_CASE("hetero_train: a misspelled flag is an error naming the nearest one",
          "[settings][bad-input]") {
  auto r = runTrain({"--epohcs", "1"});
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("hetero_train: configuration error: unknown option '--epohcs'; did you mean "
                      "'--epochs'? (see --help)") != std::string::npos);

  // troupe's own flags still pass through the app's parser; a typo of one names it.
  r = runTrain({"--epochs", "1", "--head-timeout", "5000"});
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("unknown option '--head-timeout'; did you mean '--head-timeout-ms'?") !=
        std::string::npos);

  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kOne, hyperparameters(""));
  r = runTrain({"--epohcs", "1"}, root);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.failure ==
        "configuration error on algo-1 (dnn_group): unknown option '--epohcs'; did you mean "
        "'--epochs'? (see --help)");
  CHECK(roots::readFile(root + "/output/failure")
            .find("exit code 2 (CONFIG_ERROR) on algo-1 (dnn_group)") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(root + "/output/success"));
}

TEST_CASE("hetero_train: an unknown hyperparameter is an error in output/failure",
          "[settings][sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kOne, hyperparameters(R"("epohcs": "3")"));
  auto r = runTrain({}, root);
  INFO(r.output);
  CHECK(r.code == 2);
  auto message = "unknown hyperparameter 'epohcs' in " + root +
                 "/input/config/hyperparameters.json; did you mean 'epochs'?";
  CHECK(r.output.find(message) != std::string::npos);
  CHECK(r.failure == "configuration error on algo-1 (dnn_group): " + message);
}

TEST_CASE("hetero_train: a bad hyperparameter value is an error in output/failure",
          "[settings][sagemaker][bad-input]") {
  roots::TempDir dir;
  for (std::string value : {"abc", "0"}) {
    auto root = roots::makeRoot(dir / ("algo-" + value), kOne,
                                hyperparameters(R"("epochs": ")" + value + "\""));
    auto r = runTrain({}, root);
    INFO(value << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(r.failure.find("configuration error on algo-1 (dnn_group): ") == 0);
    CHECK(r.failure.find("--epochs") != std::string::npos);
    CHECK(r.failure.find("(hyperparameter 'epochs' = '" + value + "' in " + root +
                         "/input/config/hyperparameters.json)") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(root + "/output/success"));
  }
}

TEST_CASE("a --head-group that names no group is an error naming the nearest",
          "[settings][sagemaker][bad-input]") {
  roots::TempDir dir;
  auto root =
      roots::makeRoot(dir / "algo-1", R"({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
    "current_group_name": "data_group", "instance_groups": [
      {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1"]},
      {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2"]}]})");
  roots::writeChannelSecret(root);
  harness::Run run({deploy::smApp()}, {"TROUPE_SM_ROOT=" + root, "TROUPE_HEAD_GROUP=dnn_grop",
                                       "TROUPE_PORT=" + std::to_string(deploy::freePort())});
  CHECK(run.wait(20s) == 2);
  INFO(run.output());
  auto failure = roots::firstLine(root + "/output/failure");
  CHECK(failure.find("configuration error on algo-1 (data_group): --head-group "
                     "(TROUPE_HEAD_GROUP) 'dnn_grop' is not an instance group of ") == 0);
  CHECK(failure.find("did you mean 'dnn_group'? groups are: data_group, dnn_group") !=
        std::string::npos);
}

TEST_CASE("hetero_train makes output/data/ for its report where SageMaker did not",
          "[settings][outputs]") {
  // SageMaker makes /opt/ml/output but not always output/data; the report must not vanish.
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kOne,
                              hyperparameters(R"("epochs": "1", "train_samples": "512")"));
  std::filesystem::remove_all(root + "/output/data");
  auto r = runTrain({}, root);
  INFO(r.output);
  CHECK(r.code == 0);
  auto report = roots::readFile(root + "/output/data/report.json");
  CHECK(report.find("\"exit_status\": 0") != std::string::npos);
  // No channel at all: the image's dataset, said so.
  CHECK(r.output.find("no input channels under " + root +
                      "/input/data: training on the Fashion-MNIST installed here") !=
        std::string::npos);
}

TEST_CASE("hetero_train under a SageMaker root refuses a misnamed or missing train channel",
          "[settings][bad-input][sagemaker]") {
  // Training silently on the image's bundled dataset would report success on the wrong data.
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kOne, hyperparameters(R"("epochs": "1")"));
  std::filesystem::create_directories(root + "/input/data/training");
  auto r = runTrain({}, root);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.failure.find("no 'train' channel under " + root + "/input/data (channels: training); "
                       "hetero_train reads its dataset from the channel named 'train'") !=
        std::string::npos);

  auto root2 = roots::makeRoot(dir / "algo-2", kOne, hyperparameters(R"("epochs": "1")"));
  roots::writeFile(root2 + "/input/config/inputdataconfig.json",
                   R"({"train": {"TrainingInputMode": "File"}})");
  r = runTrain({}, root2);
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(r.failure.find("the 'train' channel is declared in " + root2 +
                       "/input/config/inputdataconfig.json but " + root2 +
                       "/input/data/train does not exist") != std::string::npos);

  // An explicit data dir is the user's choice.
  std::filesystem::create_directory_symlink("/usr/share/datasets/fashion-mnist", dir / "mine");
  auto root3 = roots::makeRoot(dir / "algo-3", kOne,
                               hyperparameters(R"("epochs": "1", "train_samples": "512",
                                   "data_dir": ")" + (dir / "mine") + R"(")"));
  std::filesystem::create_directories(root3 + "/input/data/training");
  r = runTrain({}, root3);
  INFO(r.output);
  CHECK(r.code == 0);
}

TEST_CASE("hetero_train fails the job, naming the path, when its report cannot be written",
          "[settings][outputs][bad-input]") {
  roots::TempDir dir;
  auto root = roots::makeRoot(dir / "algo-1", kOne,
                              hyperparameters(R"("epochs": "1", "train_samples": "512")"));
  auto r = runTrain({"--report", "/dev/null/report.json"}, root);
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.failure.find("cannot write the report (--report /dev/null/report.json): cannot create "
                       "the folder /dev/null") != std::string::npos);
}
