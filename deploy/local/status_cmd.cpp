#include "status_cmd.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "job_file.h"
#include "troupe/config.h"
#include "troupe/exit_codes.h"
#include "troupe/loop.h"
#include "troupe/secret.h"
#include "troupe/status.h"

using json = nlohmann::ordered_json;

namespace sim {

namespace {

// -- text --

std::string seconds(int64_t ms) {
  char text[32];
  snprintf(text, sizeof(text), ms < 10000 ? "%.1f s" : "%.0f s", ms / 1000.0);
  return text;
}

class Table {
  // Columns padded to their widest cell; `right` columns (numbers) aligned right.
 public:
  Table(std::vector<std::string> header, std::vector<bool> right)
      : rows_{kj::mv(header)}, right_(kj::mv(right)) {}
  void add(std::vector<std::string> row) { rows_.push_back(kj::mv(row)); }
  void print() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        auto pad = std::string(width[c] - row[c].size(), ' ');
        line += right_[c] ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : "");
        if (c + 1 < row.size()) line += "  ";
      }
      printf("%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (auto& i : items) out += (out.empty() ? "" : " ") + i;
  return out;
}

void printText(const troupe::JobStatus& job) {
  printf("job: %s for %s, head %s at %s\n\n", job.phase.c_str(), seconds(job.uptimeMs).c_str(),
         job.head.c_str(), job.headAddress.c_str());

  Table groups({"group", "instance type", "alive", "hosts"}, {false, false, false, false});
  for (auto& g : job.groups) {
    groups.add({g.name, g.instanceType,
                std::to_string(g.alive) + "/" + std::to_string(g.hosts.size()), join(g.hosts)});
  }
  groups.print();
  printf("\n");

  Table nodes({"host", "group", "instance type", "vcpus", "gpus", "state", "heartbeat", "cpu",
               "over", "loop held"},
              {false, false, false, true, true, false, false, true, false, false});
  std::vector<std::string> lost, held;
  for (auto& n : job.nodes) {
    std::string heartbeat = n.head                  ? "(head)"
                            : n.heartbeatAgeMs >= 0 ? seconds(n.heartbeatAgeMs) + " ago"
                                                    : "-";
    char cpu[32] = "-";
    if (n.loadKnown) snprintf(cpu, sizeof(cpu), "%.0f%%", n.cpuPercent);
    std::string holds = "-";
    if (n.loopHolds > 0) {
      holds = std::to_string(n.loopHolds) + "x, longest " + seconds(n.longestHoldMs);
      held.push_back(std::string(n.info.host()) + ": the event loop was held " +
                     seconds(n.longestHoldMs) + " by " + n.longestHoldBy);
    }
    nodes.add({std::string(n.info.host()), std::string(n.info.group()),
               std::string(n.info.instanceType()), std::to_string(n.info.vcpus()),
               std::to_string(n.info.gpus()), n.state, heartbeat, cpu,
               n.loadKnown ? seconds(n.cpuIntervalMs) : "-", holds});
    if (!n.why.empty()) lost.push_back(n.why);
  }
  nodes.print();
  for (auto& why : lost) printf("  %s\n", why.c_str());
  for (auto& line : held) printf("  %s\n", line.c_str());
  printf("\n");

  if (job.actors.empty()) {
    printf("no actors\n");
    return;
  }
  Table actors({"id", "actor", "type", "host", "state", "incarnation", "mailbox"},
               {true, false, false, false, false, true, true});
  for (auto& a : job.actors) {
    actors.add({std::to_string(a.address.id), a.address.name.empty() ? "-" : a.address.name,
                a.address.typeName, a.address.host, a.state, std::to_string(a.address.incarnation),
                a.mailbox >= 0 ? std::to_string(a.mailbox) : "-"});
  }
  actors.print();
}

// -- JSON --

json orNull(bool known, json value) {
  return known ? value : json(nullptr);
}

json toJson(const troupe::JobStatus& job) {
  json nodes = json::array(), groups = json::array(), actors = json::array();
  for (auto& n : job.nodes) {
    nodes.push_back({{"host", std::string(n.info.host())},
                     {"group", std::string(n.info.group())},
                     {"instance_type", std::string(n.info.instanceType())},
                     {"address", std::string(n.info.address())},
                     {"vcpus", n.info.vcpus()},
                     {"gpus", n.info.gpus()},
                     {"state", n.state},
                     {"head", n.head},
                     {"heartbeat_age_ms", orNull(n.heartbeatAgeMs >= 0, n.heartbeatAgeMs)},
                     {"cpu_percent", orNull(n.loadKnown, std::round(n.cpuPercent * 10) / 10)},
                     {"cpu_interval_ms", orNull(n.loadKnown, n.cpuIntervalMs)},
                     {"load_age_ms", orNull(n.loadKnown, n.loadAgeMs)},
                     {"loop_holds", n.loopHolds},
                     {"longest_hold_ms", orNull(n.loopHolds > 0, n.longestHoldMs)},
                     {"longest_hold_by", orNull(n.loopHolds > 0, n.longestHoldBy)},
                     {"lost_because", orNull(!n.why.empty(), n.why)}});
  }
  for (auto& g : job.groups) {
    groups.push_back({{"name", g.name},
                      {"instance_type", g.instanceType},
                      {"hosts", g.hosts},
                      {"alive", g.alive}});
  }
  for (auto& a : job.actors) {
    actors.push_back({{"id", a.address.id},
                      {"name", a.address.name},
                      {"type", a.address.typeName},
                      {"host", a.address.host},
                      {"group", a.address.group},
                      {"state", a.state},
                      {"incarnation", a.address.incarnation},
                      {"mailbox", orNull(a.mailbox >= 0, a.mailbox)},
                      {"parent", orNull(a.parent != 0, a.parent)}});
  }
  return {{"head", job.head},   {"head_address", job.headAddress},
          {"phase", job.phase}, {"uptime_ms", job.uptimeMs},
          {"nodes", nodes},     {"groups", groups},
          {"actors", actors}};
}

// -- where to ask, with which secret --

struct Target {
  std::vector<std::string> addresses;  // asked in turn until one answers
  std::string secret;
  bool insecure = false;
};

Target target(const StatusOptions& o) {
  if (!o.refusedToken.empty()) troupe::refuseSecretArgument("--token");
  Target t;
  t.insecure = o.insecure;
  std::string tokenFile = o.tokenFile;
  auto fromEnvironment = troupe::takeSecretFromEnvironment();
  if (o.head.empty()) {
    auto jobs = findRunningJobs();
    if (jobs.mine.empty()) {
      std::string others =
          jobs.othersRunning == 0
              ? ""
              : " (" + std::to_string(jobs.othersRunning) +
                    " troupe sim job(s) of other users run here; troupe status does not ask "
                    "them)";
      throw troupe::StatusError(
          troupe::JOIN_FAILED,
          "no running troupe sim job of yours here (no troupe-sim-*/job.json of yours with a "
          "running simulator in " +
              std::filesystem::temp_directory_path().string() + ")" + others +
              "; for another job give its head's address and secret: troupe status --head "
              "HOST:PORT --token-file FILE");
    }
    auto job = &jobs.mine.front();
    if (jobs.mine.size() > 1) {
      // Which one and why, on stderr (stdout stays the report, --json too).
      std::string rest;
      for (size_t i = 1; i < jobs.mine.size(); ++i) {
        rest += (i > 1 ? ", " : "") + std::to_string(jobs.mine[i].simPid);
      }
      fprintf(stderr,
              "troupe status: %zu troupe sim jobs of yours run here; asking the newest (simulator "
              "pid %d, %s); the others' simulators: pid %s. For one of them give --head "
              "HOST:PORT --token-file FILE (troupe sim prints its instances' addresses)\n",
              jobs.mine.size(), job->simPid, job->path.c_str(), rest.c_str());
    }
    for (auto& in : job->instances) t.addresses.push_back(in.address);
    if (tokenFile.empty() && fromEnvironment.empty()) tokenFile = job->secretFile;
    t.insecure = t.insecure || job->insecure;
  } else {
    auto colon = o.head.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == o.head.size() ||
        o.head.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      throw troupe::ConfigError("--head '" + o.head +
                                "': expected HOST:PORT, the address the job's head listens on "
                                "(troupe sim prints one line per instance)");
    }
    t.addresses.push_back(o.head);
  }
  if (!tokenFile.empty() && !fromEnvironment.empty()) {
    throw troupe::ConfigError("the job secret is given twice, in TROUPE_TOKEN and in the file '" +
                              tokenFile +
                              "' (--token-file, TROUPE_TOKEN_FILE); give one, the file");
  }
  if (!tokenFile.empty()) {
    t.secret = troupe::readSecretFile(tokenFile);
  } else if (!fromEnvironment.empty()) {
    troupe::checkSecret(fromEnvironment, "TROUPE_TOKEN");
    t.secret = fromEnvironment;
  } else {
    throw troupe::ConfigError(
        "no job secret: give troupe status the file the job's nodes read it from, with "
        "--token-file FILE or TROUPE_TOKEN_FILE=FILE");
  }
  return t;
}

}  // namespace

CLI::App* addStatusCommand(CLI::App& cli, StatusOptions& o) {
  auto* status = cli.add_subcommand(
      "status",
      "print a running job's nodes, groups, actors (state, incarnation, mailbox depth) and "
      "per-node CPU use, asked of its head");
  status->add_option(
      "--head", o.head,
      "HOST:PORT of the job's head (a worker's address works too); default: the "
      "newest running `troupe sim` job of yours on this machine (never another user's)");
  status
      ->add_option("--token-file", o.tokenFile,
                   "a file only you can read holding the job secret (default with no --head: "
                   "the troupe sim job's)")
      ->envname("TROUPE_TOKEN_FILE");
  status->add_option("--token", o.refusedToken)->group("");  // refused, with the reason
  status
      ->add_flag("--insecure", o.insecure,
                 "the job runs with --insecure: plaintext, the secret sent in the request")
      ->envname("TROUPE_INSECURE");
  status->add_flag("--json", o.json, "print one JSON object");
  status->add_option("--timeout-ms", o.timeoutMs, "give up on a node after this long")
      ->check(CLI::Range(1u, 600000u));
  return status;
}

int runStatus(const StatusOptions& o) {
  try {
    auto t = target(o);
    troupe::EventLoop loop(1);
    std::optional<troupe::JobStatus> job;
    for (size_t i = 0; !job; ++i) {
      try {
        job = troupe::fetchStatus(loop, {t.addresses[i], t.secret, t.insecure, o.timeoutMs});
      } catch (const troupe::StatusError& e) {
        // A troupe sim instance that is gone: ask the next one (any of them names the head).
        if (e.code() != troupe::JOIN_FAILED || i + 1 == t.addresses.size()) throw;
      }
    }
    if (o.json) {
      printf("%s\n", toJson(*job).dump(2).c_str());
    } else {
      printText(*job);
    }
    return troupe::OK;
  } catch (const troupe::StatusError& e) {
    fprintf(stderr, "troupe status: %s\n", e.what());
    return e.code();
  } catch (const troupe::ConfigError& e) {
    fprintf(stderr, "troupe status: configuration error: %s\n", e.what());
    return troupe::CONFIG_ERROR;
  } catch (const std::exception& e) {
    // JobTls's key derivation, say.
    fprintf(stderr, "troupe status: %s\n", e.what());
    return troupe::INTERNAL_ERROR;
  }
}

}  // namespace sim
