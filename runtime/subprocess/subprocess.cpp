#include "subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace troupe::subprocess {

int exitStatus(int waitStatus) {
  if (WIFEXITED(waitStatus)) return WEXITSTATUS(waitStatus);
  if (WIFSIGNALED(waitStatus)) return 128 + WTERMSIG(waitStatus);
  return -1;
}

namespace {

// Opens a stream's file before the fork (the child may only make async-signal-safe calls): the
// descriptor to put in place, or -1 to leave the stream as it is. Throws naming the file.
int openStream(const Stream& s, bool forReading) {
  switch (s.kind) {
    case Stream::Kind::kInherit:
      return -1;
    case Stream::Kind::kNull:
      return open("/dev/null", (forReading ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
    case Stream::Kind::kFile: {
      int fd = forReading ? open(s.path.c_str(), O_RDONLY | O_CLOEXEC)
                          : open(s.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        throw std::runtime_error("cannot open '" + s.path + "' for a child process: " +
                                 strerror(errno));
      }
      return fd;
    }
    case Stream::Kind::kFd:
      return s.fd;
  }
  return -1;
}

}  // namespace

// Looked up before the fork (execvpe may allocate, which a child of a threaded process must not).
std::string inPath(const std::string& name) {
  const char* path = getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    auto candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st;
    if (access(candidate.c_str(), X_OK) == 0 && stat(candidate.c_str(), &st) == 0 &&
        !S_ISDIR(st.st_mode)) {
      return candidate;
    }
  }
  return name;
}

Child::Child(const Spec& spec) : group_(spec.ownProcessGroup) {
  if (spec.argv.empty()) throw std::invalid_argument("a child process needs an argv");
  // Everything the child needs, built before the fork.
  std::vector<std::string> env;
  if (spec.inheritEnv) {
    for (char** e = environ; *e != nullptr; ++e) {
      if (spec.dropTroupeEnv && strncmp(*e, "TROUPE_", 7) == 0) continue;
      env.push_back(*e);
    }
  }
  for (auto& e : spec.env) {
    auto key = e.substr(0, e.find('=') + 1);
    std::erase_if(env, [&](const std::string& v) { return v.rfind(key, 0) == 0; });
    env.push_back(e);
  }
  std::vector<char*> argv, envp;
  for (auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::string program = spec.program.empty() ? spec.argv[0] : spec.program;
  if (program.find('/') == std::string::npos) program = inPath(program);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (spec.pinCpu >= 0) CPU_SET(spec.pinCpu, &cpus);

  int in = openStream(spec.in, true);
  int out = openStream(spec.out, false);
  int err = spec.errToOut ? out : openStream(spec.err, false);
  auto closeOpened = [&]() {
    for (auto [fd, s] : {std::pair{in, &spec.in}, {out, &spec.out}, {err, &spec.err}}) {
      if (fd >= 0 && s->kind != Stream::Kind::kFd && !(s == &spec.err && spec.errToOut)) close(fd);
    }
  };
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    int e = errno;
    closeOpened();
    throw std::runtime_error("cannot start '" + program + "': fork: " + strerror(e));
  }
  if (pid_ == 0) {
    // Async-signal-safe calls only, until exec.
    if (spec.ownProcessGroup) setpgid(0, 0);
    if (spec.parentDeathSignal != 0) {
      prctl(PR_SET_PDEATHSIG, spec.parentDeathSignal);
      if (getppid() != parent) _exit(127);  // it died before the line above
    }
    // Signals as a freshly started program expects them, whatever this process set.
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT}) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (in >= 0) dup2(in, STDIN_FILENO);  // dup2 clears O_CLOEXEC on the copy
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) _exit(127);
    if (spec.pinCpu >= 0 && sched_setaffinity(0, sizeof(cpus), &cpus) != 0) _exit(126);
    if (spec.nice != 0 && setpriority(PRIO_PROCESS, 0, spec.nice) != 0) _exit(125);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  // Either side may win the race to set the group; both ask for the same.
  if (spec.ownProcessGroup) setpgid(pid_, pid_);
  closeOpened();
}

Child::~Child() {
  if (pid_ <= 0 || status_) return;
  if (group_) ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  wait();
}

std::optional<int> Child::poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) status_ = exitStatus(st);
  return status_;
}

std::optional<int> Child::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

int Child::wait() {
  if (status_ || pid_ <= 0) return status_.value_or(-1);
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  status_ = exitStatus(st);
  return *status_;
}

void Child::signal(int signal) {
  if (pid_ > 0 && !status_) ::kill(pid_, signal);
}

void Child::signalGroup(int signal) {
  if (pid_ > 0 && group_) ::kill(-pid_, signal);
}

int Child::stop(std::chrono::milliseconds grace) {
  if (status_ || pid_ <= 0) return status_.value_or(-1);
  signal(SIGTERM);
  if (!wait(grace)) {
    signalGroup(SIGKILL);
    signal(SIGKILL);
    wait();
  }
  signalGroup(SIGKILL);  // anything left in its group
  return *status_;
}

int runToEnd(Spec spec, std::string* output) {
  char path[] = "/tmp/troupe-run-XXXXXX";
  int fd = -1;
  if (output != nullptr) {
    fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return 127;
    spec.out = Stream::of(fd);
    spec.errToOut = true;
  } else if (spec.out.kind == Stream::Kind::kInherit && spec.err.kind == Stream::Kind::kInherit &&
             !spec.errToOut) {
    spec.out = Stream::null();
    spec.errToOut = true;
  }
  int status = 127;
  try {
    Child child(spec);
    status = child.wait();
  } catch (const std::exception&) {
    status = 127;
  }
  if (output != nullptr) {
    close(fd);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    *output = ss.str();
    unlink(path);
  }
  return status;
}

}  // namespace troupe::subprocess
