// File: troupe/exit_codes.h
//
// How a troupe process exits. Every process of a job exits with the job's status; a node that
// could not take part exits with the reason it could not. Documented in docs/exit-codes.md.

#pragma once

namespace troupe {

enum ExitCode : int {
  OK = 0,              // the driver's promise resolved and every actor stopped cleanly
  JOB_FAILED = 1,      // the driver failed, or an actor's abnormal exit escalated to the root
  CONFIG_ERROR = 2,    // a bad cluster file, host map or option; nothing was started
  HEAD_LOST = 3,       // a worker lost the head (connection closed, or silent past the timeout)
  AUTH_FAILED = 4,     // this node and the head hold different job secrets (TLS), or the head
                       // refused its token (--insecure)
  JOIN_FAILED = 5,     // the cluster did not form before the join deadline
  INTERRUPTED = 6,     // SIGTERM or SIGINT on some node ended the job (gracefully)
  FENCED = 7,          // the head declared this node lost and cut it off; the job goes on without it
  INTERNAL_ERROR = 70  // a bug in troupe
};

const char* exitCodeName(int code);  // "JOB_FAILED"

}  // namespace troupe
