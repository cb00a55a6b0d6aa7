// File: troupe/cli11.h
//
// parseAppFlags(): an app's own CLI11 parser beside troupe::run()'s flags and SageMaker's
// hyperparameters, with the checks of troupe/app_settings.h. Header-only: the app links CLI11
// (CLI11::CLI11) itself.
//
//   CLI::App cli("hetero_train");
//   cli.add_option("--epochs", s.epochs)->check(CLI::Range(1u, 1000u));
//   try {
//     troupe::parseAppFlags(cli, argc, argv);
//   } catch (const troupe::ConfigError& e) {
//     troupe::configError(e.what());
//   }

#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "troupe/app_settings.h"

namespace troupe {

inline std::vector<std::string> flagNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (auto& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}
// Every long flag of `app`: "--epochs", ..., "--help".

inline void parseAppFlags(CLI::App& app, int argc, char* argv[],
                          std::vector<std::string> defaults = {},
                          const SageMakerEnv& sm = SageMakerEnv::detect()) {
  // Parses the app's flags from, in this order, the last given winning for a single-value option:
  //   1. `defaults`, flags the app derives itself (from `sm`, say);
  //   2. under SageMaker (`sm`: by default SageMakerEnv::detect()), every hyperparameter as the
  //   flag of the same name ("epochs": "3" ->
  //      --epochs 3; `a_b` -> --a-b), after checkHyperparameters() accepted them all, unless the
  //      command line gives that flag;
  //   3. the command line, argv[1..].
  // Leaves troupe::run()'s flags to it and rejects any other leftover (checkAppArguments()).
  // --help prints the app's help and exits 0. Every problem throws ConfigError naming the flag and
  // the value, and for a value that came from a hyperparameter, the key and the file.
  app.allow_extras();
  for (CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() == 1) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  const auto known = flagNames(app);
  std::vector<std::string> args = std::move(defaults);
  struct FromHyperparameter {
    std::string flag, key, value;
  };
  std::vector<FromHyperparameter> fromHyperparameters;
  if (sm.active()) {
    // Hidden flags (group "": tests only) are no hyperparameters, and are not listed as known.
    std::vector<std::string> names;
    for (const CLI::Option* option : app.get_options()) {
      if (option->get_group().empty()) continue;
      for (auto& name : option->get_lnames()) names.push_back(name);
    }
    checkHyperparameters(sm, names);
    for (auto& key : sm.keys()) {
      std::string flag = "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      if (std::find(known.begin(), known.end(), flag) == known.end()) continue;  // sagemaker_*
      bool overridden = false;  // by the command line: its value is the one checked
      bool same = false;        // ... with the hyperparameter's value (deploy/sagemaker/train's)
      for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        std::string value = arg == flag && i + 1 < argc ? argv[i + 1]
                            : arg.rfind(flag + "=", 0) == 0 ? arg.substr(flag.size() + 1)
                                                            : std::string();
        if (arg != flag && arg.rfind(flag + "=", 0) != 0) continue;
        overridden = true;
        same = value == *sm.raw(key);
      }
      if (overridden) {
        // An error in the value then names the hyperparameter it came from, and its file.
        if (same) fromHyperparameters.push_back({flag, key, *sm.raw(key)});
        continue;
      }
      args.push_back(flag);
      args.push_back(*sm.raw(key));
      fromHyperparameters.push_back({flag, key, *sm.raw(key)});
    }
  }
  args.insert(args.end(), argv + 1, argv + argc);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::Success& e) {  // --help
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    for (auto& h : fromHyperparameters) {
      auto at = message.find(h.flag);
      bool named = at != std::string::npos &&
                   (at + h.flag.size() == message.size() ||
                    !(isalnum(message[at + h.flag.size()]) || message[at + h.flag.size()] == '-'));
      if (named) {
        message += " (hyperparameter '" + h.key + "' = '" + h.value + "' in " +
                   sm.hyperparametersPath() + ")";
        break;
      }
    }
    throw ConfigError(message + " (see --help)");
  }
  checkAppArguments(app.remaining(), known);
}

}  // namespace troupe
