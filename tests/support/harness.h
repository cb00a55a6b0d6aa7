// Starting `troupe sim` (or an app alone) as a real child process for integration tests, and
// making sure nothing it started outlives the test.

#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "subprocess.h"
#include "temp_dir.h"

namespace harness {

struct Instance {
  std::string host, group, address;
  pid_t pid = 0;
};

class Run {
  // One child process whose stdout and stderr go to a file. The destructor SIGKILLs and reaps it
  // and every instance it reported, if they still run.
 public:
  Run(std::vector<std::string> argv, std::vector<std::string> extraEnv = {});
  ~Run();
  Run(const Run&) = delete;

  pid_t pid() const { return child_->pid(); }
  int wait(std::chrono::milliseconds timeout);
  // The exit code (128 + signal when killed), or -1 on timeout. The first time it sees a code
  // above 0 it prints reasons() on stderr: a failing test's output begins with why the job ended.
  std::string reasons(int code) const;
  // The output's error and exit lines, each once with its count (hosts named alike): a few lines
  // where 256 instances each said the same.
  void quietReasons() { reasonsSaid_ = true; }
  // For a caller that judges every end itself and prints one line a run (fault_soak).
  bool waitFor(const std::string& text, std::chrono::milliseconds timeout);
  // True once the output contains `text`; false at the timeout or when the run ends without it.
  bool waitFor(const std::regex& pattern, std::chrono::milliseconds timeout);
  // The same for a match of `pattern` (std::regex_search) anywhere in the output.
  std::string output() const;
  std::map<std::string, Instance> instances() const;
  // Parsed from the simulator's "troupe sim: algo-N GROUP TYPE ADDRESS pid=N" lines; for a job
  // the simulator started again (--restarts-on-interrupt), the latest run's.
  std::vector<pid_t> allPids() const;
  // Every instance of every run the simulator started.
  std::vector<pid_t> leftovers() const;
  // Instances of any run that still exist (not reaped, or still running).
  std::string exitLine(const std::string& host) const;
  // The simulator's "HOST (GROUP) exited with N" line for `host`, or "".
  const std::string& workDir() const { return workDir_.path(); }
  // The child's working folder, a fresh one removed with the Run (with what `troupe sim` kept
  // there: troupe-out/). Relative paths in argv are relative to it.

  void ignoreSanitizerReports(std::string why) { ignoreSanitizerWhy_ = std::move(why); }
  // For a test whose processes the sanitizer runtime cannot serve (out of file descriptors on
  // purpose): their reports are printed as ignored, with `why`, and do not fail the test.

 private:
  bool waitUntil(const std::function<bool(const std::string&)>& seen,
                 std::chrono::milliseconds timeout);
  void reportSanitizerFindings() const;
  // One line on stderr, "troupe-harness: sanitizer report ...", when the output holds one.

  troupe::testing::TempDir workDir_{"troupe-test"};  // removed last, after every process is reaped
  std::string outPath_, argv0_, ignoreSanitizerWhy_;
  bool reasonsSaid_ = false;
  std::unique_ptr<troupe::subprocess::Child> child_;
};

std::vector<std::string> sim(std::vector<std::string> simArgs, std::vector<std::string> app);
// argv for `troupe sim SIMARGS -- APP...`.

std::string troupeBinary();
std::string probeApp();

bool processExists(pid_t pid);

unsigned freePort();
// A loopback port nothing listens on now (bound and closed: another process may take it).

bool headDoneHostKilled(int simCode, const std::string& out);
// The job finished on its head (0) while a worker killed by SIGKILL stayed dead (the harness
// runs without --node-restarts): troupe sim judges every host as SageMaker does, so it exits 137
// and says that the head finished.

// A TCP connection to "ip:port", from the local address `from` when given (127.0.0.2: another
// peer address on loopback); -1 when it fails.
int connectTo(const std::string& address, const std::string& from = "");

std::vector<std::string> probe(const std::string& scenario);
// argv of the probe app running `scenario` (tests/integration/probe_app.cpp).
Instance instanceIn(const Run& run, const std::string& group);
// The first instance of `group` the simulator reported; throws std::logic_error if none.
size_t count(const std::string& text, const std::string& needle);
// How often `needle` occurs in `text`.
std::string outOfOrder(const std::string& text, const std::vector<std::string>& needles);
// "" when each of `needles` occurs in `text` after the one before it; else which is missing or
// comes too early, for the test's message: CHECK(outOfOrder(out, {"a", "b"}) == "").
std::string readFile(const std::string& path);
// The file's bytes ("" when it cannot be read).
std::string rootsOf(const Run& run);
// The instances' roots folder a `troupe sim --keep` run printed ("" if none).
std::string headOf(const std::string& roots);
// The head's host among those roots (from the sim's role files), or "".

}  // namespace harness

// REQUIRE that `run` prints `text` within `timeout`; on failure the message carries the output so
// far, so a CI log says what the cluster was doing instead.
#define REQUIRE_OUTPUT(run, text, timeout)                                             \
  do {                                                                                 \
    bool seen_ = (run).waitFor((text), (timeout));                                     \
    if (!seen_) FAIL("never printed '" << (text) << "'; output:\n" << (run).output()); \
  } while (false)
