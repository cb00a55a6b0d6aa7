// File: troupe/secret.h
//
// The job secret (RunOptions::token, "the cluster token" in messages): the same value on every
// instance of a job; a peer must show it before anything on a node is reachable. It never appears
// on a command line, in the environment of a child process, in a log, or in a file under an
// instance's root. troupe::run() takes the first of:
//
//   --token-file FILE / TROUPE_TOKEN_FILE   a file only its owner can read (mode 0600 or 0400)
//   TROUPE_TOKEN                            for Kubernetes' secretKeyRef; troupe::run() removes it
//                                           from its environment before anything else happens
//   <root>/input/data/troupe-secret/FILE    under a SageMaker root: the input channel
//                                           deploy/sagemaker/launch.py passes
//   a fresh random secret                   a cluster of one host (nobody to share it with)
//
// Every secret has at least kMinSecretLength characters. `--token VALUE` is refused: anyone on the
// machine can read a command line (ps, /proc/PID/cmdline), and so is a `troupe_token`
// hyperparameter, which DescribeTrainingJob shows. A file, the variable and the channel each name
// how to do it right.

#pragma once

#include <cstddef>
#include <string>

#include "troupe/sagemaker.h"

namespace troupe {

constexpr size_t kMinSecretLength = 32;
// randomToken()'s 32 hex digits (128 bits). Shorter secrets are refused wherever they come from.

constexpr const char* kSecretChannel = "troupe-secret";
// The SageMaker input channel that carries the secret. SageMakerEnv::channels() leaves it out: it
// is troupe's, not the app's.

std::string readSecretFile(const std::string& path);
// The secret in `path` with trailing whitespace (a newline) stripped. Throws ConfigError naming
// the file and what to do when it is missing or not a regular file, readable or writable by its
// group or others (mode & 077: "chmod 600 FILE"), empty, or shorter than kMinSecretLength.

std::string readChannelSecret(const SageMakerEnv& env);
// Under a SageMaker root: the secret in the one file under input/data/troupe-secret/ (at any
// depth), stripped as above; "" when there is no such channel. The file's mode is not checked:
// SageMaker itself writes that folder on the instance, before the container starts, and no other
// user runs there. Throws ConfigError when the channel holds no file or more than one, or the
// secret is short.

void refuseSecretHyperparameter(const SageMakerEnv& env);
// Throws ConfigError when `env` has a `troupe_token` hyperparameter: SageMaker shows
// hyperparameters to anyone allowed to call DescribeTrainingJob; the message points to the
// troupe-secret channel.

std::string takeSecretFromEnvironment();
// TROUPE_TOKEN's value ("" when it is not set), after removing it from this process's
// environment, so no child process inherits it, and overwriting it in the environment block the
// process started with, so /proc/PID/environ no longer shows it. Call before any thread starts.

void checkSecret(const std::string& secret, const std::string& where);
// Throws ConfigError when `secret` is shorter than kMinSecretLength, naming `where` (the file or
// the variable), the length, and how to make a good one.

void refuseSecretArgument(const std::string& arg);
// Throws ConfigError when the command-line argument `arg` is `--token` or `--token=...`, saying
// why and pointing to --token-file. run() checks its arguments, and checkAppArguments() an app's.

void writeSecretFile(const std::string& path, const std::string& secret);
// Writes `secret` and a newline to `path`, created anew with mode 0600 (an existing file or link
// there is removed first). Throws ConfigError naming the path when it cannot.

}  // namespace troupe
