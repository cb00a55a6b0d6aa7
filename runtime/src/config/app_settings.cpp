#include "troupe/app_settings.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "troupe/exit_codes.h"
#include "troupe/run_options.h"
#include "troupe/secret.h"

namespace troupe {

namespace {

// Edit distance where swapping two neighbours counts as one edit (optimal string alignment).
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string dashless(std::string name) {
  name.erase(0, name.find_first_not_of('-'));
  return name;
}

std::string underscored(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string upper(std::string text) {
  for (auto& c : text) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

std::string nearestName(const std::string& name, const std::vector<std::string>& known) {
  // Compared without leading dashes, so "--epohcs" is one edit from "--epochs".
  auto bare = dashless(name);
  size_t limit = bare.size() <= 4 ? 1 : bare.size() / 3;
  std::string best;
  size_t bestDistance = limit + 1;
  for (auto& candidate : known) {
    size_t distance = editDistance(bare, dashless(candidate));
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

void checkAppArguments(const std::vector<std::string>& leftovers,
                       const std::vector<std::string>& appFlags) {
  auto run = runFlags();
  std::vector<std::string> known = appFlags;
  for (auto& f : run) known.push_back(f.flag);
  for (size_t i = 0; i < leftovers.size(); ++i) {
    const auto& arg = leftovers[i];
    refuseSecretArgument(arg);
    auto name = arg.substr(0, arg.find('='));
    auto flag = std::find_if(run.begin(), run.end(), [&](auto& f) { return f.flag == name; });
    if (flag != run.end()) {
      // run()'s: it reads the value itself ("--port 7000"; "--port=7000" is one argument).
      if (flag->takesValue && name == arg) ++i;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      auto near = nearestName(name, known);
      throw ConfigError("unknown option '" + name + "'" +
                        (near.empty() ? "" : "; did you mean '" + near + "'?") + " (see --help)");
    }
    throw ConfigError("unexpected argument '" + arg + "' (see --help)");
  }
}

namespace {

// What deploy/sagemaker/train reads itself, and troupe_<variable> for run()'s TROUPE_*.
std::vector<std::string> troupeHyperparameters() {
  std::vector<std::string> troupe = {"troupe_app", "troupe_args", "troupe_pass_args",
                                     "troupe_python", "troupe_node_restarts"};
  for (auto& f : runFlags()) {
    if (!f.variable.empty()) troupe.push_back(lower(f.variable));
  }
  return troupe;
}

}  // namespace

std::vector<std::string> troupeHyperparameterWarnings(const SageMakerEnv& env) {
  std::vector<std::string> warnings;
  if (!env.active()) return warnings;
  auto troupe = troupeHyperparameters();
  for (auto& key : env.keys()) {
    if (key.rfind("troupe_", 0) != 0 || key == "troupe_token") continue;
    auto name = underscored(key);
    if (std::find(troupe.begin(), troupe.end(), name) != troupe.end()) continue;
    auto near = nearestName(name, troupe);
    warnings.push_back("hyperparameter '" + key + "' in " + env.hyperparametersPath() +
                       " sets " + upper(name) + ", which troupe itself does not read" +
                       (near.empty() ? "" : "; did you mean '" + near + "'?"));
  }
  return warnings;
}

void checkHyperparameters(const SageMakerEnv& env, const std::vector<std::string>& known) {
  if (!env.active()) return;
  std::vector<std::string> names;
  for (auto& k : known) {
    if (k != "help") names.push_back(underscored(dashless(k)));
  }
  refuseSecretHyperparameter(env);
  for (auto& key : env.keys()) {
    if (key.rfind("sagemaker_", 0) == 0) continue;  // SageMaker's own (sagemaker_program, ...)
    // troupe's own: deploy/sagemaker/train passes each as TROUPE_<NAME>; never the app's to
    // refuse (troupeHyperparameterWarnings() names one troupe does not read).
    if (key.rfind("troupe_", 0) == 0) continue;
    auto name = underscored(key);
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    std::string what = "unknown hyperparameter '" + key + "' in " + env.hyperparametersPath();
    auto near = nearestName(name, names);
    if (!near.empty()) throw ConfigError(what + "; did you mean '" + near + "'?");
    for (auto& f : runFlags()) {
      // "port": troupe's own option, which deploy/sagemaker/train takes as troupe_<variable>.
      if (!f.variable.empty() && underscored(dashless(f.flag)) == name) {
        throw ConfigError(what + ": it is troupe's option " + f.flag +
                          "; set it as the hyperparameter '" + lower(f.variable) + "'");
      }
    }
    throw ConfigError(what + "; known: " + join(names) +
                      " (and SageMaker's own sagemaker_*, troupe's troupe_*)");
  }
  for (auto& warning : troupeHyperparameterWarnings(env)) spdlog::warn("{}", warning);
}

void configError(const std::string& message) {
  fprintf(stderr, "%s: configuration error: %s\n", program_invocation_short_name, message.c_str());
  if (SageMakerEnv::detected()) {
    auto root = SageMakerEnv::defaultRoot();
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    std::string who = host;
    try {
      auto c = ClusterConfig::load(root + "/input/config/resourceconfig.json");
      who = c.currentHost + " (" + c.currentGroup + ")";
    } catch (const ConfigError&) {
      // run() reports a bad cluster file; here it only names the instance.
    }
    if (!writeFailureFile(
            root + "/output", "configuration error on " + who + ": " + message,
            "exit code " + std::to_string(CONFIG_ERROR) + " (CONFIG_ERROR) on " + who)) {
      fprintf(stderr, "%s: cannot write %s/output/failure\n", program_invocation_short_name,
              root.c_str());
    }
  }
  fflush(stdout);
  fflush(stderr);
  _exit(CONFIG_ERROR);
}

}  // namespace troupe
