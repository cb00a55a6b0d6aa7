// File: troupe/process.h
//
// Child processes on the embedded libuv loop (uv_spawn): used by `troupe sim` to start one process
// per simulated instance, and by tests. libuv reaps its children through its own SIGCHLD handler;
// nothing else in the process may call waitpid(-1).

#pragma once

#include <kj/async.h>
#include <kj/function.h>

#include <string>
#include <vector>

#include "troupe/loop.h"

namespace troupe {

struct ChildExit {
  int64_t status = 0;  // exit code when `signal` is 0
  int signal = 0;      // the signal that ended the child, or 0
};

class ChildProcess {
  // One child process. Output (stdout and stderr) arrives line by line on the loop thread.
  // Destroying a ChildProcess that still runs sends it SIGKILL; libuv still reaps it.
 public:
  struct Options {
    std::vector<std::string> args;  // args[0] is the program (looked up in PATH)
    std::vector<std::string> env;   // "KEY=value"; empty = inherit this process's environment
    kj::Maybe<kj::Function<void(kj::StringPtr line, bool isStderr)>> onLine;  // none = inherit
  };

  ChildProcess(EventLoop& loop, Options options);
  ~ChildProcess() noexcept(false);
  KJ_DISALLOW_COPY(ChildProcess);

  int pid() const { return pid_; }
  bool running() const;
  kj::Promise<ChildExit> onExit();
  // Resolves once the child has been reaped and its output fully delivered.
  void kill(int signum);

  struct State;  // implementation detail, public for libuv's C callbacks

 private:
  EventLoop& loop_;
  State* state_;  // deletes itself once every libuv handle is closed
  int pid_;
  kj::ForkedPromise<ChildExit> exited_;
};

}  // namespace troupe
