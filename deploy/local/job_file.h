// The state file a running `troupe sim` keeps in its folder so that `troupe status` finds the job
// without being told where: $TMPDIR/troupe-sim-<pid>/job.json, mode 0600, written when each run
// starts and removed when the simulator ends. It holds the path of the job's secret file, never
// the secret, and every instance's address; `troupe status` asks the first that answers (a worker
// names its head). No head address is in it: which instance is the head is the app's to decide
// (its head group), and the simulator learns it only when the instances have started.

#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sim {

struct JobFile {
  int simPid = 0;  // the simulator; the file is stale once it has exited
  unsigned run = 1;
  std::string secretFile;
  bool insecure = false;  // the instances run with TROUPE_INSECURE (--env ...:TROUPE_INSECURE=1)
  struct Instance {
    std::string host, group, instanceType, address;
  };
  std::vector<Instance> instances;
  std::string path;  // where it was read from
};

constexpr const char* kJobFileName = "job.json";

void writeJobFile(const std::filesystem::path& path, const JobFile& job);
// Writes `job` to `path` with mode 0600, replacing what is there in one step (a reader never sees
// half a file). Throws std::runtime_error naming the path when it cannot.

struct RunningJobs {
  std::vector<JobFile> mine;  // this user's, newest first
  size_t othersRunning = 0;   // other users' jobs that run here: counted, never read
};
RunningJobs findRunningJobs();
void removeStaleFolders();
// Removes this user's troupe-sim-<pid> folders whose simulator is gone (killed by SIGKILL: its
// destructors never ran): the whole folder, or, where it was --keep (a `.keep` file), its secret
// and job file alone.
// The troupe-sim-*/job.json files under the temporary folder ($TMPDIR, else /tmp) whose
// simulator still runs. Only files this user owns are read: `troupe status` never asks another
// user's job, also as root.

}  // namespace sim
