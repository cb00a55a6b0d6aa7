// troupe::subprocess (runtime/subprocess/subprocess.h): exit codes and signals read as one number,
// a child that outlives its wait is killed and reaped by the destructor, a process group takes a
// grandchild down with it, output and environment reach where the spec says.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "subprocess.h"
#include "temp_dir.h"

using namespace std::chrono_literals;
using troupe::subprocess::Child;
using troupe::subprocess::runToEnd;
using troupe::subprocess::Spec;
using troupe::subprocess::Stream;

namespace {

Spec shell(const std::string& script) {
  Spec s;
  s.argv = {"sh", "-c", script};
  return s;
}

// Gone: no such process, or a zombie nobody of ours has to reap (init reaps reparented ones).
bool gone(pid_t pid) {
  for (int i = 0; i < 200; ++i) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    auto close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("subprocess: an exit code and a signal each read as one number", "[subprocess]") {
  Child exits(shell("exit 3"));
  CHECK(exits.wait() == 3);
  Child killed(shell("kill -9 $$"));
  CHECK(killed.wait() == 128 + SIGKILL);
  CHECK(killed.reaped());
  // A program that does not exist exits 127, as from a shell.
  Spec missing;
  missing.argv = {"/nonexistent/troupe-no-such-program"};
  CHECK(Child(missing).wait() == 127);
  CHECK(runToEnd(missing) == 127);
}

TEST_CASE("subprocess: a child still running when its Child is destroyed is killed and reaped",
          "[subprocess]") {
  pid_t pid = 0;
  {
    Child sleeper(shell("exec sleep 30"));
    pid = sleeper.pid();
    CHECK_FALSE(sleeper.wait(50ms).has_value());  // the wait ends at its timeout
    CHECK_FALSE(sleeper.reaped());
  }
  // The promise: nothing left, not even a zombie of ours.
  CHECK(kill(pid, 0) != 0);
  CHECK(errno == ESRCH);
  CHECK(waitpid(pid, nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);
}

TEST_CASE("subprocess: stop() takes down the child's whole process group, a grandchild too",
          "[subprocess]") {
  troupe::testing::TempDir dir("troupe-subprocess");
  std::string file = dir / "grandchild";
  // The trap comes first: the file says the shell is ready, and a SIGTERM that reached it
  // before the trap would end it with 143 (seen under ASan in CI).
  auto spec = shell("trap '' TERM; sleep 30 & echo $! > " + file + ".tmp && mv " + file +
                    ".tmp " + file + "; wait");
  spec.ownProcessGroup = true;
  Child parent(spec);
  std::string text;
  for (int i = 0; i < 500 && text.empty(); ++i) {
    std::this_thread::sleep_for(10ms);
    text = readAll(file);
  }
  REQUIRE_FALSE(text.empty());
  pid_t grandchild = std::stoi(text);
  // The shell ignores SIGTERM: stop() waits its grace, then SIGKILLs the group.
  auto status = parent.stop(200ms);
  CHECK(status == 128 + SIGKILL);
  CHECK(gone(grandchild));
}

TEST_CASE("subprocess: output, environment and working folder go where the spec says",
          "[subprocess]") {
  std::string text;
  CHECK(runToEnd(shell("echo out; echo err >&2; exit 4"), &text) == 4);
  CHECK(text.find("out\n") != std::string::npos);
  CHECK(text.find("err\n") != std::string::npos);

  setenv("TROUPE_SUBPROCESS_TEST", "parent's", 1);
  auto env = shell("echo \"[$TROUPE_SUBPROCESS_TEST|$EXTRA|$HOME]\"; pwd");
  env.env = {"EXTRA=given"};
  env.dropTroupeEnv = true;
  env.cwd = "/";
  CHECK(runToEnd(env, &text) == 0);
  CHECK(text.find("[|given|" + std::string(getenv("HOME") ? getenv("HOME") : "") + "]") !=
        std::string::npos);
  CHECK(text.find("\n/\n") != std::string::npos);
  env.dropTroupeEnv = false;
  CHECK(runToEnd(env, &text) == 0);
  CHECK(text.find("[parent's|given|") != std::string::npos);
  unsetenv("TROUPE_SUBPROCESS_TEST");

  // To a file, stderr beside stdout; stdin from /dev/null unless given.
  char path[] = "/tmp/troupe-subprocess-out-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  auto toFile = shell("echo one; echo two >&2; cat");
  toFile.out = Stream::file(path);
  toFile.errToOut = true;
  CHECK(Child(toFile).wait() == 0);
  CHECK(readAll(path) == "one\ntwo\n");
  unlink(path);
}
