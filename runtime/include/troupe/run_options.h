// File: troupe/run_options.h
//
// What run() reads from its flags, its TROUPE_* variables and the app's defaults (troupe/run.h):
// RunOptions, and the list of run()'s flags. Apart from run.h so that the runtime's parts that
// read the options (the node, the control path, actor hosting) include them without the entry
// point above them.

#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct RunOptions {
  // Defaults an app may set in code; flags and TROUPE_* environment variables override them.
  std::string headGroup;  // --head-group / TROUPE_HEAD_GROUP; empty: the GPU group, else first host
  std::string clusterFile;         // --cluster / TROUPE_CLUSTER_FILE
  std::string hostMapFile;         // --host-map / TROUPE_HOST_MAP
  std::string token;      // the job secret: read from tokenFile (or TROUPE_TOKEN, then unset)
  std::string tokenFile;  // --token-file / TROUPE_TOKEN_FILE: a file of mode 0600 holding it
  bool insecure = false;  // --insecure / TROUPE_INSECURE=1: plaintext, token sent in the login
  unsigned port = 7077;            // --port / TROUPE_PORT, when the host map has no entry
  unsigned joinTimeoutMs = 60000;  // --join-timeout-ms: the cluster must form within this
  unsigned heartbeatMs = 500;      // --heartbeat-ms: how often workers send heartbeats
  unsigned nodeTimeoutMs = 3000;   // --node-timeout-ms: silence tolerated on a steady link; the
                                   // detector adds the slack a jittery link shows
  unsigned nodeTimeoutMaxMs = 0;   // --node-timeout-max-ms: a node silent this long is lost
                                   // whatever its history (0: twice --node-timeout-ms)
  unsigned controlPort = 0;        // --control-port: the head's control listener (0: any free)
  unsigned headTimeoutMs = 5000;   // --head-timeout-ms: a worker exits after losing the head
  unsigned stopTimeoutMs = 5000;   // --stop-timeout-ms: default per-actor stop deadline
  unsigned stallWarnMs = 200;      // --stall-warn-ms: an actor method holding the event loop
                                   // longer is named in a warning (0: never)
  unsigned vcpus = 0, gpus = 0;    // --vcpus/--gpus: replace the detected figures (0 = detect)
  uint64_t memoryBytes = 0;        // --memory-bytes; all three within the type's (node_size.h)
  // --labels / TROUPE_LABELS ("zone=a,disk=nvme") and --resources / TROUPE_RESOURCES ("fpga=2"):
  // this node's user labels and custom resources, over the cluster file's per key.
  std::string labels;
  std::string resources;
  // --max-message-bytes: larger messages are refused. 1 GiB: a batch of ImageNet at 224 x 224 in
  // float32 is 154 MB at batch size 256 (a message's one blob holds at most 512 MiB).
  uint64_t maxMessageBytes = 1ull << 30;
  std::string logLevel = "info";           // --log-level / TROUPE_LOG_LEVEL
  // Before a peer has logged in (TLS handshake and login call): how long it may take, and how
  // many such connections a node holds at once; more are closed on accept.
  unsigned loginTimeoutMs = 5000;   // --login-timeout-ms / TROUPE_LOGIN_TIMEOUT_MS
  unsigned maxUnauthenticated = 64;  // --max-unauthenticated / TROUPE_MAX_UNAUTHENTICATED
  // The merged timeline (troupe/trace.h, docs/tracing.md): every node given --trace records
  // spans; the head writes the whole job's to this file at the end. Empty: nothing recorded.
  std::string traceFile;            // --trace / TROUPE_TRACE
  unsigned traceBufferSpans = 1u << 18;  // --trace-buffer-spans: per thread; more are dropped
  // Membership (docs/lifecycle.md, "Membership"):
  unsigned incarnation = 0;  // --incarnation / TROUPE_INCARNATION: which process of this host
                             // (0; the entry point counts each one it starts again)
  std::vector<std::string> startWith;  // --start-with GROUP=N / TROUPE_START_WITH: the job starts
                                       // once GROUP has N nodes; its other hosts join later
};

struct RunFlag {
  std::string flag;      // "--head-group"
  std::string variable;  // "TROUPE_HEAD_GROUP"; empty for --troupe-help
  bool takesValue;       // false only for --troupe-help
};
std::vector<RunFlag> runFlags();
// The flags run() reads from the command line (the fields of RunOptions, and --troupe-help). run()
// leaves every other argument to the app (Driver::args()); an app that parses its own flags
// checks what its parser left over against these (troupe/app_settings.h does).

}  // namespace troupe
