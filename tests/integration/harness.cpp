#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace harness {

std::string troupeBinary() {
  return TROUPE_BINARY;
}
std::string probeApp() {
  return PROBE_APP;
}

bool processExists(pid_t pid) {
  if (kill(pid, 0) != 0) return errno != ESRCH;
  // A zombie is not running; it only lacks a reaper.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return !(close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z');
}

int connectTo(const std::string& address) {
  auto colon = address.rfind(':');
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::stoi(address.substr(colon + 1)));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::vector<std::string> probe(const std::string& scenario) {
  return {probeApp(), "--scenario", scenario};
}

Instance instanceIn(const Run& run, const std::string& group) {
  for (auto& [host, i] : run.instances()) {
    if (i.group == group) return i;
  }
  throw std::logic_error("no instance in group " + group + "; output:\n" + run.output());
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<std::string> sim(std::vector<std::string> simArgs, std::vector<std::string> app) {
  std::vector<std::string> argv = {troupeBinary(), "sim"};
  argv.insert(argv.end(), simArgs.begin(), simArgs.end());
  argv.push_back("--");
  argv.insert(argv.end(), app.begin(), app.end());
  return argv;
}

Run::Run(std::vector<std::string> argv, std::vector<std::string> extraEnv) {
  char tmpl[] = "/tmp/troupe-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    throw std::runtime_error(std::string("mkdtemp: ") + strerror(errno));
  workDir_ = tmpl;
  outPath_ = workDir_ + "/output.log";
  close(open(outPath_.c_str(), O_WRONLY | O_CREAT, 0644));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, workDir_.c_str());
  posix_spawn_file_actions_addopen(&actions, 1, outPath_.c_str(), O_WRONLY | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (strncmp(*e, "TROUPE_", 7) != 0) env.push_back(*e);
  }
  env.insert(env.end(), extraEnv.begin(), extraEnv.end());
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid_ = 0;
  posix_spawn_file_actions_destroy(&actions);
}

Run::~Run() {
  auto pids = allPids();
  if (status_ < 0 && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  for (auto pid : pids) {
    if (processExists(pid)) kill(pid, SIGKILL);
  }
  std::error_code ec;
  std::filesystem::remove_all(workDir_, ec);
}

int Run::wait(std::chrono::milliseconds timeout) {
  if (status_ >= 0) return status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool Run::waitFor(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (output().find(text) != std::string::npos) return true;
    if (wait(std::chrono::milliseconds(0)) >= 0) {
      // It ended: nothing more will be written.
      return output().find(text) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string Run::output() const {
  std::ifstream in(outPath_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<std::string, Instance> Run::instances() const {
  std::map<std::string, Instance> out;
  static const std::regex line(R"(troupe sim: (\S+)\s+(\S+)\s+\S+\s+(\S+)\s+pid=(\d+))");
  auto text = output();
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
    Instance i;
    i.host = (*it)[1];
    i.group = (*it)[2];
    i.address = (*it)[3];
    i.pid = std::stoi((*it)[4]);
    out[i.host] = i;
  }
  return out;
}

std::vector<pid_t> Run::allPids() const {
  std::vector<pid_t> pids;
  static const std::regex line(R"(troupe sim: \S+\s+\S+\s+\S+\s+\S+\s+pid=(\d+))");
  auto text = output();
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

std::vector<pid_t> Run::leftovers() const {
  std::vector<pid_t> left;
  for (auto pid : allPids()) {
    if (processExists(pid)) left.push_back(pid);
  }
  return left;
}

std::string Run::exitLine(const std::string& host) const {
  auto text = output();
  auto at = text.find("troupe sim: " + host + " (");
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

}  // namespace harness
