// Emulated SageMaker roots for the deploy tests: a temporary folder per test holding one
// /opt/ml-shaped root per instance, removed with everything in it when the test ends.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "temp_dir.h"

namespace roots {

namespace fs = std::filesystem;

using TempDir = troupe::testing::TempDir;

inline void writeFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string firstLine(const std::string& path) {
  auto text = readFile(path);
  return text.substr(0, text.find('\n'));
}

// A job secret of the length troupe asks for (troupe/secret.h: at least 32 characters).
inline const std::string kSecret = "deploy-test-secret-0123456789abcdef";

inline void writeSecretFile(const std::string& path, const std::string& secret = kSecret,
                            mode_t mode = 0600) {
  // For --token-file / TROUPE_TOKEN_FILE: a file only its owner can read, unless `mode` says else.
  writeFile(path, secret + "\n");
  chmod(path.c_str(), mode);
}

inline void writeChannelSecret(const std::string& root, const std::string& secret = kSecret) {
  // What deploy/sagemaker/launch.py's troupe-secret channel gives an instance; SageMaker writes the
  // file with its own mode (0644 here), which troupe does not check.
  writeFile(root + "/input/data/troupe-secret/secret", secret + "\n");
}

inline std::string makeRoot(const std::string& root, const std::string& resourceConfig,
                            const std::string& hyperparameters = "{}") {
  // What SageMaker lays out before it starts the container.
  fs::create_directories(root + "/model");
  fs::create_directories(root + "/output/data");
  fs::create_directories(root + "/input/data");
  if (!resourceConfig.empty())
    writeFile(root + "/input/config/resourceconfig.json", resourceConfig);
  writeFile(root + "/input/config/hyperparameters.json", hyperparameters);
  return root;
}

}  // namespace roots
