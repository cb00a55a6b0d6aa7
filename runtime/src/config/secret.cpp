#include "troupe/secret.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "troupe/config.h"

extern char** environ;

namespace troupe {

namespace fs = std::filesystem;

namespace {

const char* const kHowToMake = "make one with: (umask 077; openssl rand -hex 16 > secret)";

std::string octal(mode_t mode) {
  char text[8];
  snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

std::string stripped(std::string text) {
  while (!text.empty() && isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

std::string readWhole(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw ConfigError(what + " cannot be read: " + strerror(errno));
  return stripped(text.str());
}

// Where the kernel put this process's initial environment: what /proc/PID/environ shows, whatever
// unsetenv() does to `environ` later. Fields 50 and 51 of /proc/self/stat (proc(5)).
bool initialEnvironmentBlock(uintptr_t& start, uintptr_t& end) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  start = end = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 50) start = std::stoull(field);
    if (i == 51) end = std::stoull(field);
  }
  return start != 0 && end > start;
}

}  // namespace

void checkSecret(const std::string& secret, const std::string& where) {
  if (secret.size() >= kMinSecretLength) return;
  throw ConfigError("the job secret in " + where + " has " + std::to_string(secret.size()) +
                    " characters; it needs at least " + std::to_string(kMinSecretLength) + "; " +
                    kHowToMake);
}

std::string readSecretFile(const std::string& path) {
  std::string what = "the secret file '" + path + "' (--token-file, TROUPE_TOKEN_FILE)";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    throw ConfigError(what + " cannot be read: " + strerror(errno) + "; " + kHowToMake);
  }
  if (!S_ISREG(st.st_mode)) throw ConfigError(what + " is not a regular file; pass a file");
  if ((st.st_mode & 077) != 0) {
    throw ConfigError(what + " has mode " + octal(st.st_mode) +
                      ": others than its owner may read or change it; run chmod 600 '" + path +
                      "' (and make a new secret if someone may have read it)");
  }
  auto secret = readWhole(path, what);
  if (secret.empty()) throw ConfigError(what + " is empty; " + kHowToMake);
  checkSecret(secret, "'" + path + "'");
  return secret;
}

std::string readChannelSecret(const SageMakerEnv& env) {
  // SageMaker downloads the channel into this folder before the container starts; nobody else
  // writes there, so unlike a --token-file its files' modes say nothing and are not checked.
  auto dir = env.path(std::string("input/data/") + kSecretChannel);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::vector<std::string> files;
  for (auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) files.push_back(entry.path().string());
  }
  if (files.size() != 1) {
    throw ConfigError("the input channel '" + std::string(kSecretChannel) + "' (" + dir +
                      ") holds " + std::to_string(files.size()) +
                      " files; it must hold one, the job secret (deploy/sagemaker/launch.py "
                      "uploads it)");
  }
  auto secret = readWhole(files[0], "the secret file '" + files[0] + "'");
  checkSecret(secret, "'" + files[0] + "' (the " + kSecretChannel + " channel)");
  return secret;
}

void refuseSecretHyperparameter(const SageMakerEnv& env) {
  if (!env.active() || !env.has("troupe_token")) return;
  throw ConfigError("hyperparameter 'troupe_token' in " + env.hyperparametersPath() +
                    " is refused: DescribeTrainingJob shows hyperparameters to anyone allowed to "
                    "call it; pass the secret as the input channel '" +
                    kSecretChannel +
                    "' (deploy/sagemaker/launch.py does) and remove the hyperparameter");
}

std::string takeSecretFromEnvironment() {
  static const char kName[] = "TROUPE_TOKEN=";
  std::vector<char*> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, kName, sizeof(kName) - 1) == 0) entries.push_back(*e);
  }
  if (entries.empty()) return "";
  std::string value = entries.front() + sizeof(kName) - 1;
  unsetenv("TROUPE_TOKEN");
  // No pointer in `environ` reaches these strings now. Those the kernel placed at start (not
  // setenv()'s, which glibc may keep for reuse) are overwritten, so /proc/PID/environ shows zeros.
  uintptr_t start, end;
  if (initialEnvironmentBlock(start, end)) {
    for (char* entry : entries) {
      auto at = reinterpret_cast<uintptr_t>(entry);
      if (at >= start && at < end) memset(entry, 0, strlen(entry));
    }
  }
  return value;
}

void refuseSecretArgument(const std::string& arg) {
  if (arg != "--token" && arg.rfind("--token=", 0) != 0) return;
  throw ConfigError(
      "--token is refused: anyone on this machine can read a command line (ps, /proc/PID/cmdline); "
      "write the secret to a file only you can read and pass its path with --token-file FILE or "
      "TROUPE_TOKEN_FILE=FILE (" +
      std::string(kHowToMake) + ")");
}

void writeSecretFile(const std::string& path, const std::string& secret) {
  unlink(path.c_str());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw ConfigError("cannot create the secret file '" + path + "': " + strerror(errno));
  }
  std::string text = secret + "\n";
  bool ok = fchmod(fd, 0600) == 0 &&
            write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int error = errno;
  close(fd);
  if (!ok) {
    unlink(path.c_str());
    throw ConfigError("cannot write the secret file '" + path + "': " + strerror(error));
  }
}

}  // namespace troupe
