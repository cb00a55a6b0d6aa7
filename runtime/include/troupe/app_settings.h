// File: troupe/app_settings.h
//
// An app's own settings beside troupe::run()'s: its flags, its SageMaker hyperparameters, and how a
// bad one ends the process. The same command line reaches both parsers (run() takes the flags in
// runFlags(), the app the rest), so neither may ignore what it does not know, or a typo
// (`--epohcs 1`) is silently dropped. The app's parser is the one that sees everything, so it
// checks: whatever it leaves over must be one of run()'s flags, and every hyperparameter must be
// one of its settings.
//
//   CLI::App cli("my app");
//   cli.add_option("--epochs", epochs)->check(CLI::Range(1, 1000));
//   try {
//     troupe::parseAppFlags(cli, argc, argv);       // troupe/cli11.h: all of the below
//   } catch (const troupe::ConfigError& e) {
//     troupe::configError(e.what());                 // exit 2, and output/failure on SageMaker
//   }
//
// Errors name the thing and the nearest known name: "unknown option '--epohcs'; did you mean
// '--epochs'? (see --help)".

#pragma once

#include <string>
#include <vector>

#include "troupe/config.h"  // ConfigError
#include "troupe/sagemaker.h"

namespace troupe {

std::string nearestName(const std::string& name, const std::vector<std::string>& known);
// The entry of `known` closest to `name` by edit distance (a swap of two neighbours counts once),
// when it is close enough to be a typo of it: at most 1 edit for names of up to 4 characters, else
// at most a third of the length. "" when none is.

void checkAppArguments(const std::vector<std::string>& leftovers,
                       const std::vector<std::string>& appFlags);
// For an app that parses its own flags and lets run()'s through (CLI11's allow_extras()):
// `leftovers` is what its parser did not take (CLI11's remaining(), in order). Each must be one of
// run()'s flags (runFlags()), with its value ("--port 7000" or "--port=7000"). Throws ConfigError
// for the first that is not: "unknown option '--epohcs'; did you mean '--epochs'? (see --help)",
// the suggestion taken from `appFlags` ("--epochs", ...) and run()'s flags; an argument that is
// not an option: "unexpected argument 'x' (see --help)"; `--token`: the secret does not belong on
// a command line, use --token-file (troupe/secret.h).

void checkHyperparameters(const SageMakerEnv& env, const std::vector<std::string>& known);
// Every hyperparameter of `env` must be a setting the app knows: one of `known` (names without
// "--"; `a_b` and `a-b` are the same name), a key SageMaker adds itself (`sagemaker_*`: accepted
// and ignored), or one deploy/sagemaker/train reads (troupe_app, troupe_args, troupe_pass_args,
// and troupe_<variable> for run()'s TROUPE_* variables: troupe_head_group, troupe_port, ...).
// Throws ConfigError for the first that is not, naming the key, the file and the nearest known
// key, else the known ones; for `troupe_token`, saying that SageMaker shows it to anyone allowed
// to describe the job and that the secret goes in the troupe-secret channel (troupe/secret.h).
// A troupe_* hyperparameter is troupe's, never refused: one troupe does not read is a warning
// (troupeHyperparameterWarnings()). Does nothing when `env` is not active().

std::vector<std::string> troupeHyperparameterWarnings(const SageMakerEnv& env);
// One line for each troupe_* hyperparameter that names no setting of troupe's (deploy/sagemaker/
// train's own, troupe_python and troupe_node_restarts among them, and troupe_<variable> for
// run()'s TROUPE_* variables), with the nearest one's name where it looks like a typo of it.

[[noreturn]] void configError(const std::string& message);
// Ends the process as a configuration error found before or outside troupe::run() (an app
// checking its settings in main()): prints "<program>: configuration error: <message>" to
// stderr, writes output/failure ("configuration error on <host> (<group>): <message>") when the
// process runs under a SageMaker-shaped root (SageMakerEnv::detected()), and exits with
// CONFIG_ERROR (2), as run() does for its own configuration errors.

}  // namespace troupe
