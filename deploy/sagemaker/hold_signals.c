/* hold-signals PROGRAM [ARG...]: blocks SIGTERM and SIGINT, then execs PROGRAM in this process.
 *
 * The troupe image's entry point (deploy/sagemaker/Dockerfile). In a container the entry point is
 * PID 1, and the kernel drops a signal sent to PID 1 while that signal has its default action:
 * a `docker stop` (SageMaker's stop, a spot reclaim) that comes before the app has installed its
 * handler would be lost, and the job would train on until SIGKILL. A blocked signal is never
 * dropped: it stays pending. The mask and the pending set survive execve, through `train` (Python,
 * which leaves the mask alone) and the app's own re-exec, until troupe::run() takes SIGTERM and
 * SIGINT (EventLoop::onSignal installs the handler, then unblocks the signal): a stop that came
 * at any moment since this program's first instruction is then delivered, and the job ends as a
 * stopped job (exit 6, output/failure, a stop checkpoint).
 *
 * Built statically (no dynamic loader before main). An app that is not a troupe app must unblock
 * SIGTERM itself, or it never sees one. When PROGRAM cannot be started, writes the SageMaker
 * failure file (under TROUPE_SM_ROOT, else /opt/ml) and exits 2 (CONFIG_ERROR). */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CONFIG_ERROR = 2 }; /* troupe/exit_codes.h */

int main(int argc, char* argv[]) {
  sigset_t held;
  sigemptyset(&held);
  sigaddset(&held, SIGTERM);
  sigaddset(&held, SIGINT);
  sigprocmask(SIG_BLOCK, &held, NULL);

  if (argc < 2) {
    fprintf(stderr, "usage: hold-signals PROGRAM [ARG...]\n");
    return CONFIG_ERROR;
  }
  execv(argv[1], argv + 1);
  int error = errno;

  char message[4096];
  snprintf(message, sizeof message, "cannot start the entry point '%s': %s\n", argv[1],
           strerror(error));
  fprintf(stderr, "hold-signals: %s", message);
  const char* root = getenv("TROUPE_SM_ROOT");
  if (root == NULL || root[0] == '\0') root = "/opt/ml";
  char path[4096];
  snprintf(path, sizeof path, "%s/output", root);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/output/failure", root);
  FILE* f = fopen(path, "w");
  if (f != NULL) {
    fputs(message, f);
    fclose(f);
  }
  return CONFIG_ERROR;
}
