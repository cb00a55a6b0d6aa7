#include "troupe/sagemaker.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <string.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "troupe/config.h"
#include "troupe/secret.h"

namespace troupe {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string describeType(const json& j) {
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number_integer() || j.is_number_unsigned()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_array()) return "a list";
  if (j.is_object()) return "an object";
  return "null";
}

}  // namespace

std::string SageMakerEnv::defaultRoot() {
  const char* root = getenv("TROUPE_SM_ROOT");
  return root != nullptr && *root != '\0' ? root : "/opt/ml";
}

SageMakerEnv SageMakerEnv::inactive() {
  return SageMakerEnv();
}

SageMakerEnv SageMakerEnv::load(const std::string& root) {
  SageMakerEnv env;
  env.active_ = true;
  env.root_ = root;
  while (env.root_.size() > 1 && env.root_.back() == '/') env.root_.pop_back();
  env.hyperparametersFile_ = env.hyperparametersPath();

  std::error_code ec;
  if (fs::exists(env.hyperparametersFile_, ec)) {
    auto& file = env.hyperparametersFile_;
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || fs::is_directory(file, ec)) {
      throw ConfigError("hyperparameters file '" + file + "' cannot be read: " +
                        (fs::is_directory(file, ec) ? "it is a directory" : strerror(errno)));
    }
    json j;
    try {
      j = json::parse(text.str());
    } catch (const json::parse_error& e) {
      throw ConfigError("hyperparameters file " + file + " is not valid JSON: " + e.what());
    }
    if (!j.is_object()) {
      throw ConfigError("hyperparameters file " + file +
                        " must hold a JSON object of name -> value, not " + describeType(j) + " (" +
                        j.dump().substr(0, 80) + ")");
    }
    for (auto& [key, value] : j.items()) {
      // As sagemaker-training does: a string is JSON-decoded when it parses, kept otherwise.
      json decoded = value;
      if (value.is_string()) {
        env.raw_[key] = value.get<std::string>();
        try {
          decoded = json::parse(value.get<std::string>());
        } catch (const json::parse_error&) {
        }
      } else {
        env.raw_[key] = value.dump();
      }
      env.decoded_[key] = decoded.dump();
    }
  }

  auto data = fs::path(root) / "input" / "data";
  if (fs::is_directory(data, ec)) {
    for (auto& entry : fs::directory_iterator(data, ec)) {
      auto name = entry.path().filename().string();
      if (name != kSecretChannel) env.channels_.push_back(name);
    }
    std::sort(env.channels_.begin(), env.channels_.end());
  }
  return env;
}

SageMakerEnv SageMakerEnv::detect() {
  return detected() ? load(defaultRoot()) : inactive();
}

bool SageMakerEnv::detected() {
  const char* explicitRoot = getenv("TROUPE_SM_ROOT");
  std::error_code ec;
  return (explicitRoot != nullptr && *explicitRoot != '\0') ||
         fs::exists("/opt/ml/input/config/resourceconfig.json", ec);
}

std::vector<std::string> SageMakerEnv::keys() const {
  std::vector<std::string> out;
  for (auto& [key, value] : raw_) out.push_back(key);
  return out;
}

std::optional<std::string> SageMakerEnv::raw(const std::string& key) const {
  auto it = raw_.find(key);
  if (it == raw_.end()) return std::nullopt;
  return it->second;
}

std::string SageMakerEnv::getJson(const std::string& key) const {
  auto it = decoded_.find(key);
  return it == decoded_.end() ? "null" : it->second;
}

namespace {

[[noreturn]] void wrongType(const std::string& file, const std::string& key,
                            const std::string& rawValue, const nlohmann::json& value,
                            const char* wanted) {
  throw ConfigError("hyperparameter '" + key + "' in " + file + " is \"" + rawValue + "\" (" +
                    describeType(value) + "), not " + wanted + "; pass " + wanted);
}

}  // namespace

std::string SageMakerEnv::getString(const std::string& key, const std::string& fallback) const {
  auto it = decoded_.find(key);
  if (it == decoded_.end()) return fallback;
  auto value = json::parse(it->second);
  return value.is_string() ? value.get<std::string>() : value.dump();
}

int64_t SageMakerEnv::getInt(const std::string& key, int64_t fallback) const {
  auto it = decoded_.find(key);
  if (it == decoded_.end()) return fallback;
  auto value = json::parse(it->second);
  if (value.is_number_integer() || value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_float() && value.get<double>() == static_cast<int64_t>(value.get<double>())) {
    return static_cast<int64_t>(value.get<double>());
  }
  wrongType(hyperparametersFile_, key, raw_.at(key), value, "an integer");
}

double SageMakerEnv::getDouble(const std::string& key, double fallback) const {
  auto it = decoded_.find(key);
  if (it == decoded_.end()) return fallback;
  auto value = json::parse(it->second);
  if (value.is_number()) return value.get<double>();
  wrongType(hyperparametersFile_, key, raw_.at(key), value, "a number");
}

bool SageMakerEnv::getBool(const std::string& key, bool fallback) const {
  auto it = decoded_.find(key);
  if (it == decoded_.end()) return fallback;
  auto value = json::parse(it->second);
  if (value.is_boolean()) return value.get<bool>();
  // SageMaker's console and many scripts write Python's spelling.
  if (value.is_string() && value.get<std::string>() == "True") return true;
  if (value.is_string() && value.get<std::string>() == "False") return false;
  wrongType(hyperparametersFile_, key, raw_.at(key), value, "true or false");
}

std::vector<std::string> SageMakerEnv::getStrings(const std::string& key) const {
  auto it = decoded_.find(key);
  if (it == decoded_.end()) return {};
  auto value = json::parse(it->second);
  if (!value.is_array()) value = json::array({value});
  std::vector<std::string> out;
  for (auto& v : value) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

bool SageMakerEnv::hasChannel(const std::string& name) const {
  return std::find(channels_.begin(), channels_.end(), name) != channels_.end();
}

std::string SageMakerEnv::channelDir(const std::string& name) const {
  if (!hasChannel(name)) {
    std::string known;
    for (auto& c : channels_) known += (known.empty() ? "" : ", ") + c;
    throw ConfigError(
        "input channel '" + name + "' is not in " + path("input/data") +
        (known.empty() ? std::string("; there are no channels") : "; channels are: " + known) +
        " (on SageMaker: pass it to fit(); with troupe sim: --channel " + name + "=PATH)");
  }
  return path("input/data/" + name);
}

// =======================================================================================
// Outcome files

namespace {

constexpr char kReserveName[] = ".troupe-outcome";
constexpr size_t kReserveBytes = 64 * 1024;  // SageMaker reads the first 1,024 characters

// Writes `text` into the reserved file, whose blocks were allocated at start (a write there needs
// no free space), and renames it to `file`. False when there is no reserve or it is too small.
bool writeIntoReserve(const std::string& dir, const std::string& file, const std::string& text) {
  auto reserve = dir + "/" + kReserveName;
  if (text.size() > kReserveBytes) return false;
  int fd = open(reserve.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()) &&
            ftruncate(fd, static_cast<off_t>(text.size())) == 0 && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  return ok && rename(reserve.c_str(), file.c_str()) == 0;
}

bool writeOutput(const std::string& dir, const char* name, const std::string& text) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  auto file = dir + "/" + name;
  // Whole or nothing: SageMaker may read the file as soon as the process ends.
  if (writeIntoReserve(dir, file, text)) return true;
  auto temp = file + ".tmp";
  bool ok;
  {
    std::ofstream out(temp, std::ios::trunc);
    out << text;
    out.flush();
    ok = static_cast<bool>(out);
  }
  if (ok) fs::rename(temp, file, ec);
  if (!ok || ec) fs::remove(temp, ec);  // never a partial file in output/
  return ok && !ec;
}

}  // namespace

bool reserveOutcomeSpace(const std::string& outputDir) {
  std::error_code ec;
  fs::create_directories(outputDir, ec);
  auto reserve = outputDir + "/" + kReserveName;
  int fd = open(reserve.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = posix_fallocate(fd, 0, kReserveBytes) == 0;
  close(fd);
  if (!ok) unlink(reserve.c_str());
  return ok;
}

bool writeFailureFile(const std::string& outputDir, const std::string& reason,
                      const std::string& details) {
  std::string line = reason.empty() ? "the job failed (no reason was given)" : reason;
  for (auto& ch : line) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  std::error_code ec;
  fs::remove(outputDir + "/success", ec);
  return writeOutput(outputDir, "failure", line + "\n" + details + (details.empty() ? "" : "\n"));
}

bool writeSuccessFile(const std::string& outputDir, const std::string& reason) {
  std::error_code ec;
  fs::remove(outputDir + "/failure", ec);
  return writeOutput(outputDir, "success", reason + "\n");
}

}  // namespace troupe
