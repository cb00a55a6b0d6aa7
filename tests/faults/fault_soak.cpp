// fault_soak: the whole fault matrix, many seeds. Cases are dealt in shuffled rounds (every case
// once per round) from --seed; each run gets its own seed, which fixes its victim, moment and
// hold. One line per run (case, run seed, moment, outcome, exit codes, seconds, the injection),
// then a table of cases x outcomes. docs/faults.md shows how to read it.
//
//   fault_soak --cases 200 --seed 7 --minutes 150 [--only NAME]... [--run-seed X] [--json]
//              [--log-dir DIR]

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "fault_run.h"
#include "verdict.h"

namespace {

using faults::Outcome;

struct Settings {
  int cases = 30;
  uint64_t seed = 0;
  double minutes = 0;  // 0: no limit
  std::vector<std::string> only;
  std::optional<uint64_t> runSeed;
  bool json = false;
  std::string logDir;
};

struct Result {
  std::string caseName;
  faults::Observation obs;
  Outcome outcome;
  std::vector<std::string> broken;  // the promises that failed
};

volatile sig_atomic_t stopRequested = 0;

[[noreturn]] void usage(const char* why) {
  fprintf(stderr,
          "fault_soak: %s\nusage: fault_soak [--cases N] [--seed S] [--minutes M] "
          "[--only NAME]... [--run-seed X] [--json] [--log-dir DIR]\ncases:",
          why);
  for (auto& c : faults::allCases()) fprintf(stderr, " %s", c.name.c_str());
  fprintf(stderr, "\n");
  exit(2);
}

Settings parse(int argc, char* argv[]) {
  Settings s;
  s.seed = std::random_device()();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing a value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--cases")
      s.cases = std::stoi(value());
    else if (a == "--seed")
      s.seed = std::stoull(value());
    else if (a == "--minutes")
      s.minutes = std::stod(value());
    else if (a == "--only")
      s.only.push_back(value());
    else if (a == "--run-seed")
      s.runSeed = std::stoull(value());
    else if (a == "--log-dir")
      s.logDir = value();
    else if (a == "--json")
      s.json = true;
    else
      usage(("unknown argument '" + a + "'").c_str());
  }
  for (auto& name : s.only) {
    if (!faults::findCase(name)) usage(("no case '" + name + "'").c_str());
  }
  if (s.logDir.empty()) s.logDir = "/tmp/fault-soak-" + std::to_string(s.seed);
  return s;
}

std::vector<const faults::Case*> selected(const Settings& s) {
  std::vector<const faults::Case*> out;
  for (auto& c : faults::allCases()) {
    if (s.only.empty() || std::count(s.only.begin(), s.only.end(), c.name)) out.push_back(&c);
  }
  return out;
}

// A failed run's promises and the sim's whole output, for reading after the soak.
void saveLog(const Settings& s, int index, const Result& r) {
  mkdir(s.logDir.c_str(), 0755);
  auto path = s.logDir + "/" + std::to_string(index) + "-" + r.caseName + "-" +
              std::to_string(r.obs.seed) + ".log";
  std::ofstream out(path);
  out << "case " << r.caseName << " seed " << r.obs.seed << " moment " << r.obs.moment << ": "
      << r.obs.plan << "\ncodes " << faults::codesText(r.obs) << "\n";
  for (auto& b : r.broken) out << "BROKEN " << b << "\n";
  out << "\n" << r.obs.output;
}

Result runOne(const faults::Case& c, uint64_t seed, const faults::Options& options) {
  Result r{c.name, faults::runCase(c, seed, options)};
  auto checks = faults::judge(c, r.obs);
  r.outcome = faults::outcomeOf(r.obs, checks);
  for (auto& check : checks) {
    if (!check.ok) r.broken.push_back(check.promise);
  }
  if (!r.obs.skipped.empty()) r.broken.push_back("skipped: " + r.obs.skipped);
  return r;
}

void printLine(FILE* to, int index, int total, const Result& r) {
  fprintf(to, "[%3d/%d] %-24s seed=%-20llu %-15s %-52s %6.1f s  %s, %s\n", index, total,
          r.caseName.c_str(), (unsigned long long)r.obs.seed, faults::outcomeName(r.outcome),
          faults::codesText(r.obs).c_str(), r.obs.seconds, r.obs.plan.c_str(),
          r.obs.moment.c_str());
  if (r.outcome != Outcome::PASS) {
    for (size_t i = 0; i < r.broken.size() && i < 4; ++i) {
      fprintf(to, "          %s\n", r.broken[i].c_str());
    }
  }
  fflush(to);
}

using Table = std::map<std::string, std::map<Outcome, int>>;

void printTable(FILE* to, const Table& table) {
  fprintf(to, "\n%-26s", "case");
  for (auto o : faults::allOutcomes()) fprintf(to, " %15s", faults::outcomeName(o));
  fprintf(to, "\n");
  std::map<Outcome, int> totals;
  for (auto& c : faults::allCases()) {
    auto row = table.find(c.name);
    if (row == table.end()) continue;
    fprintf(to, "%-26s", c.name.c_str());
    for (auto o : faults::allOutcomes()) {
      auto n = row->second.count(o) ? row->second.at(o) : 0;
      totals[o] += n;
      fprintf(to, " %15d", n);
    }
    fprintf(to, "\n");
  }
  fprintf(to, "%-26s", "total");
  for (auto o : faults::allOutcomes()) fprintf(to, " %15d", totals[o]);
  fprintf(to, "\n");
}

nlohmann::json toJson(const Settings& s, const std::vector<Result>& results, const Table& table) {
  nlohmann::json runs = nlohmann::json::array();
  for (auto& r : results) {
    runs.push_back({{"case", r.caseName},
                    {"seed", r.obs.seed},
                    {"moment_ms", r.obs.momentMs},
                    {"moment", r.obs.moment},
                    {"injection", r.obs.plan},
                    {"outcome", faults::outcomeName(r.outcome)},
                    {"codes", faults::codesText(r.obs)},
                    {"seconds", r.obs.seconds},
                    {"broken", r.broken}});
  }
  nlohmann::json t = nlohmann::json::object();
  for (auto& [name, row] : table) {
    for (auto& [o, n] : row) t[name][faults::outcomeName(o)] = n;
  }
  return {{"seed", s.seed}, {"runs", runs}, {"table", t}};
}

bool failed(Outcome o) {
  return o != Outcome::PASS && o != Outcome::SKIPPED;
}

}  // namespace

int main(int argc, char* argv[]) {
  auto s = parse(argc, argv);
  auto cases = selected(s);
  // Ends the soak after the run under way; the run itself cleans up after itself.
  signal(SIGINT, [](int) { stopRequested = 1; });
  signal(SIGTERM, [](int) { stopRequested = 1; });
  FILE* lines = s.json ? stderr : stdout;
  fprintf(lines,
          "fault_soak: seed %llu, %d runs over %zu cases, at most %g min (0: no limit); "
          "failed runs' logs in %s\n",
          (unsigned long long)s.seed, s.cases, cases.size(), s.minutes, s.logDir.c_str());
  faults::Rng rng(s.seed);
  auto options = faults::Options::fromBuild();
  options.quiet = true;  // one line a run; a failed run's whole output is saved
  auto start = std::chrono::steady_clock::now();
  std::vector<Result> results;
  Table table;
  std::vector<const faults::Case*> round;
  for (int i = 0; i < s.cases && !stopRequested; ++i) {
    auto minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start) / 60;
    if (s.minutes > 0 && minutes.count() >= s.minutes) {
      fprintf(lines, "fault_soak: %g minutes are up after %d runs\n", s.minutes, i);
      break;
    }
    if (round.empty()) {
      round = cases;
      std::shuffle(round.begin(), round.end(), rng);
    }
    const auto* c = round.back();
    round.pop_back();
    uint64_t seed = s.runSeed ? *s.runSeed : rng();
    results.push_back(runOne(*c, seed, options));
    auto& r = results.back();
    table[r.caseName][r.outcome]++;
    printLine(lines, i + 1, s.cases, r);
    if (failed(r.outcome)) saveLog(s, i + 1, r);
  }
  printTable(lines, table);
  if (s.json) printf("%s\n", toJson(s, results, table).dump(2).c_str());
  if (std::any_of(results.begin(), results.end(), [](auto& r) { return failed(r.outcome); })) {
    return 1;
  }
  // No run judged (each skipped, or none ran) is a skip, never a pass: troupe's skip status.
  if (std::none_of(results.begin(), results.end(),
                   [](auto& r) { return r.outcome == Outcome::PASS; })) {
    fprintf(lines, "SKIP: fault_soak judged no run (%s)\n",
            results.empty() ? "none ran"
                            : (std::to_string(results.size()) + " ran, every one skipped").c_str());
    return 77;
  }
  return 0;
}
