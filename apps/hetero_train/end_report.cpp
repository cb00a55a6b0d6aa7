// hetero_train's report of a job that ended before its own (end_report.h).

#include "end_report.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "troupe/exit_codes.h"

namespace hetero_train {

std::string hex(uint64_t v) {
  char text[24];
  snprintf(text, sizeof(text), "0x%016llx", (unsigned long long)v);
  return text;
}

namespace {

// The newest checkpoint after the cascade (the trainer writes one as it stops): what is safely
// trained, and each finished epoch's counters as the finished job's report gives them.
nlohmann::json newestCheckpoint(const EndState& state, nlohmann::json& epochs) {
  if (state.checkpointDir.empty()) return nullptr;
  try {
    auto loaded = troupe::train::CheckpointDir(state.checkpointDir).latest(state.identity);
    if (!loaded) return {{"path", nullptr}, {"why", "no checkpoint was written"}};
    auto& s = loaded->state;
    for (size_t i = 0; i < s.history.size(); ++i) {
      auto& e = s.history[i];
      epochs.push_back({{"epoch", i + 1},
                        {"samples", e.samples},
                        {"duplicates", e.duplicates},
                        {"missing", e.missing},
                        {"rejected", e.rejected},
                        {"test_accuracy", e.accuracy},
                        {"seconds", e.seconds},
                        {"from_checkpoint", e.fromCheckpoint},
                        {"digest", hex(e.digest)}});
    }
    return {{"path", loaded->path.string()},
            {"epoch", std::min(s.epoch + 1, state.epochs)},
            {"step", s.steps},
            {"epochs_finished", s.history.size()}};
  } catch (const std::exception& e) {
    return {{"path", nullptr}, {"why", e.what()}};
  }
}

}  // namespace

nlohmann::json endReport(const EndState& state, const troupe::JobEnd& end,
                         nlohmann::json instances, const std::vector<std::string>& membership) {
  nlohmann::json progress = nullptr;
  if (state.progress.read) {
    auto& p = state.progress;
    double age =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.at).count();
    progress = {{"epoch", p.epoch + 1},           {"epochs", state.epochs},
                {"step", p.steps},                {"planned_steps", p.plannedSteps},
                {"samples", p.samples},           {"seconds", p.seconds},
                {"read_seconds_before_end", age}};
  }
  nlohmann::json epochs = nlohmann::json::array();
  auto checkpoint = newestCheckpoint(state, epochs);
  return {{"exit_status", end.code},
          {"exit_code_name", troupe::exitCodeName(end.code)},
          {"reason", end.reason},
          {"finished", false},
          {"progress", progress},
          {"checkpoint", checkpoint},
          {"epochs", epochs},
          {"placements", state.placements},
          {"instances", instances},
          {"membership", membership}};
}

void reportEnd(const EndState& state, const troupe::JobEnd& end, nlohmann::json instances,
               const std::vector<std::string>& membership) {
  auto j = endReport(state, end, kj::mv(instances), membership);
  std::string trained = "the trainer's progress was never read";
  if (state.progress.read) {
    auto& p = state.progress;
    trained = "epoch " + std::to_string(p.epoch + 1) + "/" + std::to_string(state.epochs) +
              ", step " + std::to_string(p.steps) + " of " + std::to_string(p.plannedSteps) +
              ", " + std::to_string(p.samples) + " samples";
  }
  printf("\nthe job ended before its report (%s): trained to %s", troupe::exitCodeName(end.code),
         trained.c_str());
  auto& c = j["checkpoint"];
  if (c.is_object() && c["path"].is_string()) {
    printf("; newest checkpoint %s (epoch %u, step %lu)", c["path"].get<std::string>().c_str(),
           c["epoch"].get<unsigned>(), (unsigned long)c["step"].get<uint64_t>());
  }
  printf("\n");
  fflush(stdout);
  if (state.reportPath.empty()) return;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { writeReport(state.reportPath, j.dump(2) + "\n"); })) {
    spdlog::error("{}", e->getDescription().cStr());
    return;
  }
  printf("report (unfinished job): %s\n", state.reportPath.c_str());
  fflush(stdout);
}

// The report's folder is made if missing; the file is written whole or not at all, and a report
// that cannot be written says so, naming the path, rather than vanishing.
void writeReport(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file(path);
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  if (ec) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("cannot write the report (--report ", path, "): cannot create the folder ",
                        file.parent_path().string(), ": ", ec.message())));
  }
  auto temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      int error = errno;
      kj::throwFatalException(KJ_EXCEPTION(
          FAILED, kj::str("cannot write the report (--report ", path, "): ", strerror(error))));
    }
  }
  fs::rename(temp, file, ec);
  if (ec) {
    kj::throwFatalException(KJ_EXCEPTION(
        FAILED, kj::str("cannot write the report (--report ", path, "): ", ec.message())));
  }
}

}  // namespace hetero_train
