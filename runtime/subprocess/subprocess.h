// Child processes for code without an event loop: the integration tests' harness, the fault
// tools, the benches and troupe sim's `ip` commands. (Code on troupe's event loop uses
// troupe::ChildProcess, troupe/process.h, which libuv reaps.) A Child is reaped on every path: its
// destructor kills a child that still runs (its whole process group, when it has one) and waits
// for it, because a leftover process is the very bug troupe exists to prevent.

#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace troupe::subprocess {

/// A wait status as one number: the exit code, or 128 + the signal that ended the process.
int exitStatus(int waitStatus);

/// `name` looked up in PATH as a shell would: the first executable file of that name in its
/// folders; unfound, the name itself (which then fails to run, 127).
std::string inPath(const std::string& name);

/// Where one of the child's standard streams goes.
struct Stream {
  enum class Kind { kInherit, kNull, kFile, kFd };
  Kind kind = Kind::kInherit;
  std::string path;  // kFile: created or truncated (stdin: opened for reading)
  int fd = -1;       // kFd: duplicated into the child

  static Stream inherit() { return {}; }
  static Stream null() { return {Kind::kNull, "", -1}; }
  static Stream file(std::string path) { return {Kind::kFile, std::move(path), -1}; }
  static Stream of(int fd) { return {Kind::kFd, "", fd}; }
};

struct Spec {
  std::vector<std::string> argv;  // argv[0] is also the program, unless `program` is set
  std::string program;            // the file to run; a name without '/' is looked up in PATH
  std::vector<std::string> env;   // added to (or replacing) this process's environment
  bool inheritEnv = true;         // start from this process's environment
  bool dropTroupeEnv = false;     // ... without its TROUPE_* variables
  std::string cwd;                // empty: this process's
  Stream in = Stream::null();
  Stream out = Stream::inherit();
  bool errToOut = false;  // stderr goes where stdout goes (else it is inherited)
  Stream err = Stream::inherit();
  bool ownProcessGroup = false;  // its own group, so a whole tree can be signalled at once
  int parentDeathSignal = 0;     // sent to it when this process dies (PR_SET_PDEATHSIG)
  int pinCpu = -1;               // its CPU affinity, one CPU
  int nice = 0;
};

class Child {
 public:
  /// Starts it. Throws std::runtime_error naming the program when it cannot fork; a program that
  /// cannot be run exits 127 (126 if the CPU cannot be pinned, 125 if the niceness is refused).
  explicit Child(const Spec& spec);
  /// Still running: SIGKILL (to its group if it has one), then reaped.
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool reaped() const { return status_.has_value(); }

  /// Its exitStatus once it has ended (reaping it), else nothing; never blocks.
  std::optional<int> poll();
  /// Waits up to `timeout`; nothing if it still runs.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  int wait();

  /// Sends `signal` to it (nothing once it is reaped).
  void signal(int signal);
  /// Sends `signal` to its process group (ownProcessGroup), which may outlive it.
  void signalGroup(int signal);
  /// SIGTERM, up to `grace` to end, then SIGKILL to it (and its group); reaps it. Its status.
  int stop(std::chrono::milliseconds grace);

 private:
  pid_t pid_ = -1;
  bool group_ = false;
  std::optional<int> status_;
};

/// Runs `spec` to its end. With `output`, stdout and stderr are captured there (the spec's own
/// streams are ignored); without, they go to /dev/null unless the spec says otherwise. Its
/// exitStatus, or 127 if it could not be started.
int runToEnd(Spec spec, std::string* output = nullptr);

}  // namespace troupe::subprocess
