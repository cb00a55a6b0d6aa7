// run()'s own flags (troupe/run_options.h), each with its TROUPE_* variable: the one list that
// run.cpp's parser and runFlags() both read.

#include "config/run_options_cli.h"

namespace troupe {

void addRunOptions(CLI::App& cli, RunOptions& o) {
  cli.set_help_flag("--troupe-help", "troupe's options");
  cli.add_option("--cluster", o.clusterFile, "cluster description (resourceconfig.json shape)")
      ->envname("TROUPE_CLUSTER_FILE");
  cli.add_option("--host-map", o.hostMapFile, "JSON host -> \"ip:port\"")
      ->envname("TROUPE_HOST_MAP");
  // The job secret comes from a file, never from the command line (troupe/secret.h).
  cli.add_option("--token-file", o.tokenFile,
                 "a file only its owner can read, holding the job secret (the same on every "
                 "instance)")
      ->envname("TROUPE_TOKEN_FILE");
  cli.add_option("--head-group", o.headGroup, "the group whose first host is the head")
      ->envname("TROUPE_HEAD_GROUP");
  cli.add_option("--port", o.port, "port when the host map has no entry")->envname("TROUPE_PORT");
  cli.add_option("--join-timeout-ms", o.joinTimeoutMs)->envname("TROUPE_JOIN_TIMEOUT_MS");
  cli.add_option("--heartbeat-ms", o.heartbeatMs)->envname("TROUPE_HEARTBEAT_MS");
  cli.add_option("--node-timeout-ms", o.nodeTimeoutMs)->envname("TROUPE_NODE_TIMEOUT_MS");
  cli.add_option("--node-timeout-max-ms", o.nodeTimeoutMaxMs,
                 "a node silent this long is lost whatever its heartbeats' history (default: "
                 "twice --node-timeout-ms)")
      ->envname("TROUPE_NODE_TIMEOUT_MAX_MS");
  cli.add_option("--head-timeout-ms", o.headTimeoutMs)->envname("TROUPE_HEAD_TIMEOUT_MS");
  cli.add_option("--control-port", o.controlPort,
                 "the port of the head's control path (liveness); 0: any free port, told to "
                 "workers as they join")
      ->envname("TROUPE_CONTROL_PORT");
  cli.add_option("--stop-timeout-ms", o.stopTimeoutMs)->envname("TROUPE_STOP_TIMEOUT_MS");
  cli.add_option("--incarnation", o.incarnation,
                 "which process of this host this is: 0, then 1, 2, ... for each one the "
                 "per-instance entry point starts again (it replaces the previous one)")
      ->envname("TROUPE_INCARNATION");
  cli.add_option("--start-with", o.startWith,
                 "GROUP=N: start the job once GROUP has N nodes; its other hosts join the running "
                 "job when they come up (repeatable; default: wait for every host)")
      ->delimiter(',')
      ->envname("TROUPE_START_WITH");
  cli.add_option("--stall-warn-ms", o.stallWarnMs,
                 "name an actor method that holds the event loop longer than this (0: never)")
      ->envname("TROUPE_STALL_WARN_MS");
  cli.add_option("--vcpus", o.vcpus)->envname("TROUPE_VCPUS");
  cli.add_option("--gpus", o.gpus)->envname("TROUPE_GPUS");
  cli.add_option("--memory-bytes", o.memoryBytes)->envname("TROUPE_MEMORY_BYTES");
  cli.add_option("--labels", o.labels, "user labels of this node: KEY=VALUE[,KEY=VALUE...]")
      ->envname("TROUPE_LABELS");
  cli.add_option("--resources", o.resources,
                 "custom resources of this node: NAME=AMOUNT[,NAME=AMOUNT...]")
      ->envname("TROUPE_RESOURCES");
  cli.add_option("--max-message-bytes", o.maxMessageBytes)->envname("TROUPE_MAX_MESSAGE_BYTES");
  cli.add_option("--log-level", o.logLevel)->envname("TROUPE_LOG_LEVEL");
  cli.add_flag("--insecure", o.insecure,
               "plaintext connections, the token sent in each login (testing only)")
      ->envname("TROUPE_INSECURE");
  cli.add_option("--login-timeout-ms", o.loginTimeoutMs,
                 "a peer must finish the TLS handshake and log in within this")
      ->envname("TROUPE_LOGIN_TIMEOUT_MS");
  cli.add_option("--max-unauthenticated", o.maxUnauthenticated,
                 "connections not yet logged in that a node holds at once")
      ->envname("TROUPE_MAX_UNAUTHENTICATED");
  cli.add_option("--trace", o.traceFile,
                 "record spans on every node; the head writes the merged timeline (Chrome "
                 "trace-event JSON, for Perfetto) to this file at the end of the job")
      ->envname("TROUPE_TRACE");
  cli.add_option("--trace-buffer-spans", o.traceBufferSpans,
                 "spans each thread keeps with --trace; later ones are dropped and counted")
      ->envname("TROUPE_TRACE_BUFFER_SPANS");
}

std::vector<RunFlag> runFlags() {
  RunOptions unused;
  CLI::App cli;
  addRunOptions(cli, unused);
  std::vector<RunFlag> flags;
  for (const CLI::Option* option : cli.get_options()) {
    for (auto& name : option->get_lnames()) {
      flags.push_back({"--" + name, option->get_envname(), option->get_items_expected_max() > 0});
    }
  }
  return flags;
}

}  // namespace troupe
