// `troupe sim` keeps what the job wrote (deploy/local/outputs.h): every instance's model/ and
// output/data/ are copied out of the temporary roots into a folder named at the end.
#include <chrono>
#include <fstream>
#include <regex>

#include "deploy_util.h"

using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kCluster = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                           "dnn_group=1:ml.p3.2xlarge"};

std::vector<std::string> with(std::vector<std::string> extra) {
  auto args = kCluster;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string firstLine(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// The folder and files of "troupe sim: outputs in DIR/: a, b, c", or {"", ""} when not printed.
std::pair<std::string, std::string> outputsLine(const std::string& out) {
  std::smatch m;
  static const std::regex line(R"(troupe sim: outputs in (\S+)/: ([^\n]*))");
  if (!std::regex_search(out, m, line)) return {"", ""};
  return {m[1], m[2]};
}

std::string rootsDir(const std::string& out) {
  std::smatch m;
  static const std::regex line(R"(troupe sim: \d+ instances, seed \d+, roots in (\S+))");
  return std::regex_search(out, m, line) ? std::string(m[1]) : "";
}

}  // namespace

TEST_CASE("troupe sim keeps model/ and output/data/ in troupe-out/<app>-<time>/ and says where",
          "[sim][outputs]") {
  harness::Run run(harness::sim(with({"--hp", "write_outputs=1"}), {deploy::smApp()}));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  auto [dir, files] = outputsLine(out);
  // The default folder is relative to the simulator's working folder.
  REQUIRE(std::regex_match(dir, std::regex(R"(troupe-out/sm_app-\d{8}-\d{6})")));
  fs::path kept = fs::path(run.workDir()) / dir;
  auto head = firstLine(kept / "output/report.json");
  CHECK(head.find("\"head\": \"algo-") != std::string::npos);  // the driver's file, from its root
  for (auto& [host, instance] : run.instances()) {
    CHECK(firstLine(kept / "model" / ("from-" + host + ".txt")) == host);  // every instance's
  }
  // The three instances all wrote model/shared.txt: the first host's is model/shared.txt, each
  // other one's is under <host>/, none lost.
  CHECK(firstLine(kept / "model/shared.txt") == "algo-1");
  CHECK(firstLine(kept / "algo-2/model/shared.txt") == "algo-2");
  CHECK(firstLine(kept / "algo-3/model/shared.txt") == "algo-3");
  CHECK(files ==
        "algo-2/model/shared.txt, algo-3/model/shared.txt, model/from-algo-1.txt, "
        "model/from-algo-2.txt, model/from-algo-3.txt, model/shared.txt, output/report.json");
  // The roots themselves are gone, as before.
  auto roots = rootsDir(out);
  REQUIRE(!roots.empty());
  CHECK(!fs::exists(roots));
}

TEST_CASE("troupe sim --out DIR keeps the outputs in DIR", "[sim][outputs]") {
  roots::TempDir tmp;
  auto target = tmp / "job-1";
  harness::Run run(
      harness::sim(with({"--hp", "write_outputs=1", "--out", target}), {deploy::smApp()}));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(outputsLine(out).first == target);
  CHECK(fs::exists(fs::path(target) / "output/report.json"));
  CHECK(firstLine(fs::path(target) / "model/from-algo-2.txt") == "algo-2");
  CHECK(!fs::exists(fs::path(run.workDir()) / "troupe-out"));
}

TEST_CASE("troupe sim makes no output folder when no instance wrote one", "[sim][outputs]") {
  harness::Run run(harness::sim(kCluster, {deploy::smApp()}));
  REQUIRE(run.wait(30s) == 0);
  auto out = run.output();
  INFO(out);
  CHECK(out.find("troupe sim: no outputs (no instance wrote to its model/ or output/data/)") !=
        std::string::npos);
  CHECK(!fs::exists(fs::path(run.workDir()) / "troupe-out"));
}

TEST_CASE("troupe sim --out refuses a file, naming it", "[sim][outputs]") {
  roots::TempDir tmp;
  auto file = tmp / "a-file";
  std::ofstream(file) << "x\n";
  harness::Run run(harness::sim(with({"--out", file}), {deploy::smApp()}));
  CHECK(run.wait(10s) == 2);
  CHECK(run.output().find("troupe sim: --out '" + file +
                          "' is a file; give a folder (made if missing)") != std::string::npos);
}
