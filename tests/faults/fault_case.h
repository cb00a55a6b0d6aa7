// The fault matrix: which process of a running hetero_train job is hit, how, and what
// docs/exit-codes.md and docs/lifecycle.md promise afterwards. Every case is one row of the table
// in fault_cases.cpp; the Catch test (faults_test.cpp) runs the quick rows, `fault_soak` any of
// them with random moments. docs/faults.md describes each case.

#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "harness.h"

namespace faults {

using Rng = std::mt19937_64;
using Millis = std::chrono::milliseconds;

enum class Role {
  HEAD,  // the dnn_group instance: it hosts the trainer and the head
  DATA,  // one data_group instance, picked at random
  SIM    // `troupe sim` itself
};

// What an injection can hit, known once the sim printed its instances.
struct Target {
  harness::Instance head;
  std::vector<harness::Instance> data;
  harness::Instance victim;  // DATA: the data instance hit; HEAD: the head; SIM: none (pid 0)
  pid_t sim = 0;
  int simPid = 0;  // names the --netns namespaces: troupe-<simPid>-<n> for algo-<n>
};

// One step of an injection, `at` after the moment the case hits.
struct Action {
  Millis at;
  std::function<void()> run;
};

// An injection: its steps, in the order of `at`, and what it does in words ("SIGSTOP algo-2
// (data_group) for 1734 ms"). Whatever it holds (open sockets) lives as long as the plan.
struct Plan {
  std::vector<Action> actions;
  std::string text;
  std::shared_ptr<void> holds;
  std::shared_ptr<std::vector<std::string>> failed = std::make_shared<std::vector<std::string>>();
  // Steps that did not happen (a command that failed), in words: the case then proves nothing.
};

using Inject = std::function<Plan(const Target&, Rng&)>;

// What one role may exit with, and within how many seconds of the moment it must be gone.
struct RoleExpect {
  std::set<int> codes;  // empty: any code but a crash
  int withinS = 180;
};

struct Expect {
  RoleExpect head;         // the dnn_group instance
  RoleExpect victim;       // DATA cases: the data instance hit
  RoleExpect workers;      // the data instances not hit (all of them in HEAD and SIM cases)
  std::optional<int> sim;  // the sim's code; none: the job's outcome as the cloud judges it
                           // (docs/exit-codes.md): the head's code, or when that is 0 the first
                           // other host's final code that is not
  bool rejoins = false;    // the victim's process is started again, rejoins and gets work
  int withinS = 180;       // the sim and everything it started are gone by then
  std::string why;         // the promise in words, for messages
};

// When the fault lands.
enum class When {
  TRAINING,  // after a drawn training step (fault_run.cpp): the default
  STARTING,  // 0..startMs after every instance's own code ran: before the one hit joined
  FORMED     // right after the head's "cluster formed", before the first step
};

// How the job runs, where a case differs from `make run`'s.
struct Setting {
  When when = When::TRAINING;
  int startMs = 150;  // STARTING: the latest moment
  std::vector<std::string> groups = {"data_group=2:ml.c5.xlarge", "dnn_group=1:ml.p3.2xlarge"};
  std::vector<std::string> appArgs;  // added to hetero_train's
  int hogsPerCore = 0;               // busy processes per CPU of this machine, for the whole run
  std::vector<std::string> simArgs;  // added to troupe sim's (--node-restarts 0, ...)
  size_t epochs = 6;                 // hetero_train's --epochs (kEpochs)
};

struct Case {
  std::string name;  // "data-kill9"; no spaces, no ';' (ctest filters)
  std::string what;  // "kill -9 a data instance"
  Role role;
  bool netns;  // needs `troupe sim --netns` (root and `ip`); skipped with the reason elsewhere
  bool quick;  // part of the quick subset in `make test`
  Inject inject;
  Expect expect;
  Setting setting = {};
};

const std::vector<Case>& allCases();
const Case* findCase(std::string_view name);

}  // namespace faults
