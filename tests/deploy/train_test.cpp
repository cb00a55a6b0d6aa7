// deploy/sagemaker/train, without a container: against an emulated root, and as the app of
// `troupe sim` (every instance through the entry script, as on SageMaker).
#include <chrono>

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
