// hetero_train's checkpoint files (troupe/train/checkpoint.h): what they hold comes back intact,
// a damaged or foreign one is refused with the reason, and an interrupted write leaves the
// previous checkpoint the one a resume reads.
#include "troupe/train/checkpoint.h"

#include <catch2/catch.hpp>
#include <cmath>

#include <fstream>

#include "test_util.h"

using Catch::Matchers::Contains;
using troupe::train::CheckpointDir;
using troupe::train::CheckpointError;
using troupe::train::decodeCheckpoint;
using troupe::train::encodeCheckpoint;
using troupe::train::JobIdentity;
using troupe::train::TrainingState;

namespace fs = std::filesystem;

namespace {

JobIdentity job() {
  JobIdentity id;
  id.trainSamples = 40;
  id.batchSize = 8;
  id.layerSizes = {784, 16, 10};
  id.seed = 42;
  id.epochs = 3;
  id.learningRate = 0.05f;
  id.momentum = 0.9f;
  return id;
}

TrainingState state(uint64_t steps) {
  TrainingState s;
  s.identity = job();
  s.epoch = 1;
  s.steps = steps;
  s.acked = {16, 8};
  s.seen.assign(40, 0);
  for (int i = 0; i < 24; ++i) s.seen[i] = 1;
  s.current.samples = 24;
  s.current.steps = 3;
  s.current.seconds = 1.5;
  s.current.fromCheckpoint = 8;
  s.history.push_back({});
  s.history[0].samples = 40;
  s.history[0].accuracy = 0.625;
  for (int i = 0; i < 100; ++i) {
    s.parameters.push_back(0.01f * i + steps);
    s.velocities.push_back(-0.001f * i);
  }
  s.writtenBy = "algo-1, a test";
  return s;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("a checkpoint gives back every field it was written with", "[checkpoint]") {
  // Resume continues exactly where the job stopped: model, momentum, positions, counts.
  auto s = state(7);
  auto back = decodeCheckpoint(encodeCheckpoint(s), "x");
  CHECK(back.identity.differences(s.identity).empty());
  CHECK(back.epoch == 1);
  CHECK(back.steps == 7);
  CHECK(back.acked == s.acked);
  CHECK(back.seen == s.seen);
  CHECK(back.current.samples == 24);
  CHECK(back.current.seconds == 1.5);
  CHECK(back.current.fromCheckpoint == 8);
  REQUIRE(back.history.size() == 1);
  CHECK(back.history[0].accuracy == 0.625);
  CHECK(back.parameters == s.parameters);
  CHECK(back.velocities == s.velocities);
  CHECK_THAT(back.writtenBy, Contains("algo-1, a test"));
}

TEST_CASE("a state without a model or a measured loss and accuracy (a script's) reads back",
          "[checkpoint]") {
  // troupe.data's state_dict(): no parameters, and NaN where the script evaluates on its own
  // (written as JSON null; the first version refused its own state as a corrupt header).
  auto s = state(7);
  s.parameters.clear();
  s.velocities.clear();
  s.identity.layerSizes.clear();
  s.current.loss = std::nan("");
  s.history[0].accuracy = std::nan("");
  s.history[0].loss = std::nan("");
  auto back = decodeCheckpoint(encodeCheckpoint(s), "x");
  CHECK(std::isnan(back.current.loss));
  REQUIRE(back.history.size() == 1);
  CHECK(std::isnan(back.history[0].accuracy));
  CHECK(std::isnan(back.history[0].loss));
  CHECK(back.parameters.empty());
  CHECK(back.acked == s.acked);
  CHECK(back.identity.differences(s.identity).empty());
}

TEST_CASE("a planned pass in a script's state reads back: its ids, batches, DDP places and the "
          "Dataset's changes",
          "[checkpoint]") {
  // troupe.data's state_dict() mid-pass: a resumed run continues the same plan, its samples
  // seeded from the same places, its workers given the same changes to the Dataset.
  auto s = state(7);
  s.parameters.clear();
  s.velocities.clear();
  s.identity.layerSizes.clear();
  troupe::train::PassPlan plan;
  for (uint32_t k = 0; k < 40; ++k) plan.ids.push_back((k * 7) % 40);
  plan.ends = {8, 16, 24, 32, 40};
  plan.baseSeed = 0x123456789abcdefull;
  plan.label = 3;
  SECTION("one rank: no places, no changes") {
    s.plan = plan;
    auto back = decodeCheckpoint(encodeCheckpoint(s), "x");
    REQUIRE(back.plan.has_value());
    CHECK(back.plan->ids == plan.ids);
    CHECK(back.plan->ends == plan.ends);
    CHECK(back.plan->places.empty());
    CHECK(back.plan->update.empty());
    CHECK(back.plan->placeOf(5) == 5);
  }
  SECTION("a DDP rank's places and a pickled change, any bytes") {
    for (uint64_t k = 0; k < 40; ++k) plan.places.push_back(k * 2 + 1);
    plan.update = std::string("\x80\x05\0pickled\xff", 12);
    s.plan = plan;
    auto back = decodeCheckpoint(encodeCheckpoint(s), "x");
    REQUIRE(back.plan.has_value());
    CHECK(back.plan->places == plan.places);
    CHECK(back.plan->placeOf(5) == 11);
    CHECK(back.plan->update == plan.update);
    CHECK(back.plan->baseSeed == plan.baseSeed);
    CHECK(back.plan->label == 3);
    // The header's counts and the bytes must agree: one byte less is refused.
    auto bytes = encodeCheckpoint(s);
    bytes.erase(bytes.size() - 5, 1);
    CHECK_THROWS_AS(decodeCheckpoint(bytes, "x"), CheckpointError);
  }
}

TEST_CASE("a damaged checkpoint is refused with the reason, never half-read", "[checkpoint]") {
  auto bytes = encodeCheckpoint(state(7));
  SECTION("a flipped byte in the weights fails the checksum") {
    bytes[bytes.size() - 100] ^= 0x10;
    CHECK_THROWS_WITH(decodeCheckpoint(bytes, "f"), Contains("f: corrupt: checksum mismatch") &&
                                                        Contains("damaged or cut short"));
  }
  SECTION("a file cut short fails the checksum") {
    bytes.resize(bytes.size() / 2);
    CHECK_THROWS_WITH(decodeCheckpoint(bytes, "f"), Contains("corrupt: checksum mismatch"));
  }
  SECTION("a file cut to a few bytes") {
    bytes.resize(12);
    CHECK_THROWS_WITH(decodeCheckpoint(bytes, "f"), Contains("cut short: 12 bytes"));
  }
  SECTION("another file") {
    CHECK_THROWS_WITH(decodeCheckpoint("{\"model\": 1}\n and more bytes", "f"),
                      Contains("not a troupe checkpoint"));
  }
  SECTION("another format version") {
    bytes[8] = 2;
    CHECK_THROWS_WITH(decodeCheckpoint(bytes, "f"),
                      Contains("format version 2; this build reads version 1"));
  }
}

TEST_CASE("another job's checkpoint is refused naming the settings that differ", "[checkpoint]") {
  troupe::test::TempDir tmp;
  CheckpointDir dir(tmp / "ck");
  dir.write(state(7));
  auto other = job();
  other.batchSize = 16;
  other.seed = 1;
  CHECK_THROWS_WITH(dir.latest(other),
                    Contains("belongs to another job (batch size 8 in the checkpoint, 16 in this "
                             "job; seed 42 in the checkpoint, 1 in this job)") &&
                        Contains("--fresh"));
  auto loaded = dir.latest(job());
  REQUIRE(loaded);
  CHECK(loaded->path.filename() == "checkpoint-0000000007.troupe");
}

TEST_CASE("the checkpoint folder keeps the newest two and names an older intact one",
          "[checkpoint]") {
  troupe::test::TempDir tmp;
  CheckpointDir dir(tmp / "ck", 2);
  CHECK_FALSE(dir.latest(job()));  // no folder yet: a fresh start
  for (uint64_t steps : {10, 20, 30}) dir.write(state(steps));
  auto files = dir.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].filename() == "checkpoint-0000000020.troupe");
  CHECK(files[1].filename() == "checkpoint-0000000030.troupe");
  CHECK(dir.latest(job())->state.steps == 30);

  // The newest damaged: refused (exit 2 in the app), naming the file, why, and the way out.
  auto bytes = slurp(files[1]);
  bytes[bytes.size() / 2] ^= 1;
  spit(files[1], bytes);
  CHECK_THROWS_WITH(dir.latest(job()),
                    Contains(files[1].string() + ": corrupt: checksum mismatch") &&
                        Contains("remove it to resume from the older intact checkpoint "
                                 "checkpoint-0000000020.troupe") &&
                        Contains("start over with --fresh"));

  // --fresh sets every checkpoint aside, deleting nothing.
  auto aside = dir.setAside();
  REQUIRE(aside);
  CHECK(dir.list().empty());
  CHECK(fs::exists(*aside / "checkpoint-0000000020.troupe"));
  CHECK(fs::exists(*aside / "checkpoint-0000000030.troupe"));
  CHECK_FALSE(dir.latest(job()));
}

TEST_CASE("a write interrupted before its rename leaves the previous checkpoint usable",
          "[checkpoint]") {
  // Atomic writes: whatever moment the process dies at, the newest checkpoint is intact.
  troupe::test::TempDir tmp;
  CheckpointDir dir(tmp / "ck");
  dir.write(state(10));
  fs::path temp;
  dir.beforeRename([&](const fs::path& t) {
    temp = t;
    throw std::runtime_error("the process died here");
  });
  CHECK_THROWS_WITH(dir.write(state(20)), Contains("died here"));
  CHECK(fs::exists(temp));  // the whole new file was written, only the rename is missing
  CHECK(fs::file_size(temp) == encodeCheckpoint(state(20)).size());
  REQUIRE(dir.list().size() == 1);
  CHECK(dir.latest(job())->state.steps == 10);

  dir.beforeRename(nullptr);
  dir.write(state(30));
  CHECK_FALSE(fs::exists(temp));  // the next write clears what the interrupted one left
  CHECK(dir.latest(job())->state.steps == 30);
}
