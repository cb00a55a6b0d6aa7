#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

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

int connectTo(const std::string& address, const std::string& from) {
  auto colon = address.rfind(':');
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::stoi(address.substr(colon + 1)));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (!from.empty()) {
    sockaddr_in local = {};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, from.c_str(), &local.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
      close(fd);
      return -1;
    }
  }
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

std::string outOfOrder(const std::string& text, const std::vector<std::string>& needles) {
  size_t from = 0;
  for (size_t i = 0; i < needles.size(); ++i) {
    auto at = text.find(needles[i], from);
    if (at != std::string::npos) {
      from = at + needles[i].size();
      continue;
    }
    if (text.find(needles[i]) == std::string::npos) return "'" + needles[i] + "' is missing";
    return "'" + needles[i] + "' comes before '" + needles[i - 1] + "'";
  }
  return "";
}

unsigned freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool headDoneHostKilled(int simCode, const std::string& out) {
  return simCode == 128 + SIGKILL &&
         out.find("the head finished, but a host above ended with 137") != std::string::npos;
}

std::vector<std::string> sim(std::vector<std::string> simArgs, std::vector<std::string> app) {
  std::vector<std::string> argv = {troupeBinary(), "sim"};
  // Without --node-restarts, a killed worker stays dead: these tests watch what its loss does
  // (the membership tests start it again on purpose).
  bool restarts = false;
  for (auto& a : simArgs) restarts = restarts || a.rfind("--node-restarts", 0) == 0;
  if (!restarts) argv.push_back("--node-restarts=0");
  argv.insert(argv.end(), simArgs.begin(), simArgs.end());
  argv.push_back("--");
  argv.insert(argv.end(), app.begin(), app.end());
  return argv;
}

Run::Run(std::vector<std::string> argv, std::vector<std::string> extraEnv) {
  outPath_ = workDir_ / "output.log";
  close(open(outPath_.c_str(), O_WRONLY | O_CREAT, 0644));
  troupe::subprocess::Spec spec;
  argv0_ = argv.empty() ? "" : argv.front();
  spec.argv = std::move(argv);
  spec.env = std::move(extraEnv);
  spec.dropTroupeEnv = true;  // the test's own TROUPE_* settings are not the child's
  spec.cwd = workDir_.path();
  spec.out = troupe::subprocess::Stream::file(outPath_);
  spec.errToOut = true;
  // A test process that dies before its destructors run (killed, or by SIGPIPE when whoever read
  // its output went away) takes what it started with it: seen, a sim left running for two hours.
  spec.parentDeathSignal = SIGKILL;
  child_ = std::make_unique<troupe::subprocess::Child>(spec);
}

Run::~Run() {
  auto pids = allPids();
  child_.reset();  // SIGKILLed and reaped if it still runs
  reportSanitizerFindings();
  for (auto pid : pids) {
    if (processExists(pid)) kill(pid, SIGKILL);
  }
  // workDir_ goes with the members, after every process is gone.
}

void Run::reportSanitizerFindings() const {
  // A finding in any process the run started (a data instance in a job that survives losing one
  // included) fails the test, whatever its exit codes: ctest's FAIL_REGULAR_EXPRESSION matches
  // this line (tests/CMakeLists.txt).
  std::ifstream in(outPath_);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("ERROR: AddressSanitizer") != std::string::npos ||
        line.find("ERROR: LeakSanitizer") != std::string::npos ||
        line.find(": runtime error: ") != std::string::npos) {
      if (!ignoreSanitizerWhy_.empty()) {
        fprintf(stderr, "troupe-harness: ignored (%s): %s\n", ignoreSanitizerWhy_.c_str(),
                line.c_str());
        return;
      }
      fprintf(stderr, "troupe-harness: sanitizer report in the output of %s: %s\n", argv0_.c_str(),
              line.c_str());
      // The report itself, to read in the test's log (the output file goes with the Run).
      for (int i = 0; i < 40 && std::getline(in, line); ++i)
        fprintf(stderr, "  %s\n", line.c_str());
      return;
    }
  }
}

int Run::wait(std::chrono::milliseconds timeout) {
  auto status = child_->wait(timeout);
  int code = status ? *status : -1;
  if (!status && timeout >= std::chrono::seconds(1) && !reasonsSaid_) {
    // A run that outlasts its test's wait: said first, with where it had got to, before ctest's
    // own timeout (set above every wait) can end the test without a word. (A shorter wait is a
    // poll: running is an answer, not a failure.)
    reasonsSaid_ = true;
    auto out = output();
    size_t from = out.size();
    for (int newlines = 0; newlines < 9 && from > 0; ++newlines) {
      auto at = out.rfind('\n', from - 1);
      from = at == std::string::npos ? 0 : at;
    }
    fprintf(stderr,
            "troupe-harness: %s still running after %lld s, the test's wait; its last lines:\n"
            "%s\n",
            argv0_.c_str(), static_cast<long long>(timeout.count() / 1000),
            out.substr(from).c_str());
  }
  if (code > 0 && !reasonsSaid_) {
    // First in the test's output, before any assertion about it: why the job says it ended.
    reasonsSaid_ = true;
    fprintf(stderr, "%s", reasons(code).c_str());
  }
  return code;
}

std::string Run::reasons(int code) const {
  // The job's own words: error and critical log lines, "exiting with N" for N > 0, the
  // simulator's "exited with" lines and failure lines; each once, with how many hosts said it
  // (host names made alike), in the order first said.
  static const std::regex said(
      R"((\b(error|critical)\s+\[)|exiting with [1-9]|exited with|^FAIL|failure:)");
  static const std::regex prefix(R"(^\[[^\]]+\] (\d\d:\d\d:\d\d\.\d+ )?)");
  static const std::regex host(R"(algo-\d+)");
  std::vector<std::pair<std::string, int>> seen;
  std::istringstream lines(output());
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_search(line, said)) continue;
    auto key = std::regex_replace(std::regex_replace(line, prefix, ""), host, "algo-N");
    auto at = std::find_if(seen.begin(), seen.end(), [&](auto& p) { return p.first == key; });
    if (at == seen.end()) {
      seen.emplace_back(key, 1);
    } else {
      ++at->second;
    }
  }
  std::string text = "troupe-harness: " + argv0_ + " ended with " + std::to_string(code) +
                     "; what its processes said of it (first said first):\n";
  if (seen.empty()) text += "  (no error line, no exit line: see the output below)\n";
  for (size_t i = 0; i < seen.size() && i < 15; ++i) {
    text += "  " + seen[i].first +
            (seen[i].second > 1 ? "  (x" + std::to_string(seen[i].second) + ")" : "") + "\n";
  }
  if (seen.size() > 15) text += "  ... and " + std::to_string(seen.size() - 15) + " more\n";
  return text;
}

bool Run::waitFor(const std::string& text, std::chrono::milliseconds timeout) {
  return waitUntil([&text](const std::string& out) { return out.find(text) != std::string::npos; },
                   timeout);
}

bool Run::waitFor(const std::regex& pattern, std::chrono::milliseconds timeout) {
  return waitUntil([&pattern](const std::string& out) { return std::regex_search(out, pattern); },
                   timeout);
}

bool Run::waitUntil(const std::function<bool(const std::string&)>& seen,
                    std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (seen(output())) return true;
    // The child itself, not wait(): a poll that finds it running is no outlasted wait.
    if (auto status = child_->wait(std::chrono::milliseconds(0))) {
      if (*status > 0 && !reasonsSaid_) {
        reasonsSaid_ = true;
        fprintf(stderr, "%s", reasons(*status).c_str());
      }
      // It ended: nothing more will be written.
      return seen(output());
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

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string rootsOf(const Run& run) {
  static const std::regex roots(R"(roots in (\S+))");
  std::smatch m;
  auto out = run.output();
  return std::regex_search(out, m, roots) ? m[1].str() : "";
}

std::string headOf(const std::string& roots) {
  for (auto& entry : std::filesystem::directory_iterator(roots)) {
    if (readFile(entry.path() / "role").rfind("head", 0) == 0) return entry.path().filename();
  }
  return "";
}

}  // namespace harness
