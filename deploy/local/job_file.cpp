#include "job_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace fs = std::filesystem;
using nlohmann::json;

namespace sim {

void writeJobFile(const fs::path& path, const JobFile& job) {
  json instances = json::array();
  for (auto& in : job.instances) {
    instances.push_back({{"host", in.host},
                         {"group", in.group},
                         {"instance_type", in.instanceType},
                         {"address", in.address}});
  }
  json j = {{"sim_pid", job.simPid},
            {"run", job.run},
            {"secret_file", job.secretFile},
            {"insecure", job.insecure},
            {"instances", instances}};
  auto text = j.dump(2) + "\n";
  auto temporary = path.string() + ".new";
  unlink(temporary.c_str());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == ssize_t(text.size());
  if (fd >= 0) ok = close(fd) == 0 && ok;
  if (!ok || rename(temporary.c_str(), path.c_str()) != 0) {
    unlink(temporary.c_str());
    throw std::runtime_error("cannot write " + path.string() + ": " + strerror(errno));
  }
}

namespace {

std::optional<JobFile> readJobFile(const fs::path& path) {
  try {
    std::ifstream in(path);
    auto j = json::parse(in);
    JobFile job;
    job.simPid = j.at("sim_pid").get<int>();
    job.run = j.at("run").get<unsigned>();
    job.secretFile = j.at("secret_file").get<std::string>();
    job.insecure = j.at("insecure").get<bool>();
    for (auto& in : j.at("instances")) {
      job.instances.push_back(
          {in.at("host"), in.at("group"), in.at("instance_type"), in.at("address")});
    }
    job.path = path.string();
    return job;
  } catch (const std::exception&) {
    return std::nullopt;  // being replaced, or not ours: not a job to report
  }
}

// The simulator that wrote the file still runs (and its pid was not reused by another program).
bool running(int pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  comm >> name;
  return name == "troupe";
}

}  // namespace

RunningJobs findRunningJobs() {
  RunningJobs found;
  std::vector<std::pair<fs::file_time_type, JobFile>> mine;
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("troupe-sim-", 0) != 0) continue;
    auto path = entry.path() / kJobFileName;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) continue;
    if (st.st_uid != geteuid()) {
      // Another user's job: not read (even where this user could, as root can), only counted,
      // by the simulator's pid in the folder's name.
      int pid = atoi(name.c_str() + strlen("troupe-sim-"));
      if (running(pid)) found.othersRunning++;
      continue;
    }
    auto time = fs::last_write_time(path, ec);
    if (ec) continue;
    auto job = readJobFile(path);
    if (!job || !running(job->simPid)) continue;
    mine.emplace_back(time, *job);
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [time, job] : mine) found.mine.push_back(job);
  return found;
}

void removeStaleFolders() {
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("troupe-sim-", 0) != 0) continue;
    struct stat st {};
    if (stat(entry.path().c_str(), &st) != 0 || st.st_uid != geteuid()) continue;
    int pid = atoi(name.c_str() + strlen("troupe-sim-"));
    if (pid <= 0 || running(pid)) continue;
    std::error_code ignored;
    if (fs::exists(entry.path() / ".keep", ignored)) {
      // Kept for the user to read (--keep); its secret never is.
      fs::remove(entry.path() / "secret", ignored);
      fs::remove(entry.path() / kJobFileName, ignored);
    } else {
      fs::remove_all(entry.path(), ignored);
    }
  }
}

}  // namespace sim
