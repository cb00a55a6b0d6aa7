"""The restart loop for a script that another program started on a SageMaker instance.

In AWS's own framework images (the PyTorch estimator's), each instance's entry point is the
sagemaker-training toolkit's ``train``: it runs the user's script itself, and ends the instance
with the script's exit status - a data instance whose process was killed (out of memory, a
SIGKILL) fails the whole job. troupe's own entry point (deploy/sagemaker/train, the wheel's
``troupe-sagemaker-train``) starts a lost data process again instead (``troupe_node_restarts``,
docs/lifecycle.md, "Membership"). So that a script run by the toolkit gets the same, importing
``troupe.data`` there makes this process that loop's parent: it runs the script again as its
child (the same interpreter, flags and arguments), passes SIGTERM and SIGINT on to it, starts it
again when it was a data instance's process and a signal killed it, and exits with the
instance's final code (deploy/sagemaker/train's ``supervise``).

Nothing changes where the toolkit did not start the script (it sets SM_TRAINING_ENV for it),
where troupe did (troupe sim with the script as the instance's command, troupe's ``train``,
which sets TROUPE_SUPERVISOR, a DDP local rank troupe.data starts), under torchrun, outside a
SageMaker-shaped root, or with TROUPE_SUPERVISE=0.
"""

import json
import os
import sys


def _root():
    root = os.environ.get("TROUPE_SM_ROOT") or "/opt/ml"
    if os.path.exists(os.path.join(root, "input", "config", "resourceconfig.json")):
        return root
    return None


def started_by_another():
    """The root when this process runs a job's script that no troupe program started, else
    None."""
    env = os.environ
    if "SM_TRAINING_ENV" not in env:
        return None  # not run by sagemaker-training (which sets it for the script it runs)
    if env.get("TROUPE_SUPERVISE", "1") == "0" or "TROUPE_SUPERVISOR" in env:
        return None  # turned off, or troupe's train (or this loop) is the parent
    if "TROUPE_LOCAL_FD" in env or "TORCHELASTIC_RUN_ID" in env:
        return None  # a local rank troupe.data started, or torchrun's rank: theirs to watch
    if env.get("TROUPE_DIE_WITH_PARENT") == str(os.getppid()):
        return None  # troupe sim runs the script as the instance's command
    if not getattr(sys, "orig_argv", None) or not os.path.isfile(sys.argv[0] or ""):
        return None  # python3 -c, an interactive session: no script to run again
    return _root()


def run_if_started_by_another():
    """Runs the restart loop and exits with its code, where :func:`started_by_another`; returns
    at once where not (and in the loop's child)."""
    root = started_by_another()
    if root is None:
        return
    from troupe import _sagemaker_train as train

    hps = {}
    try:
        with open(os.path.join(root, "input", "config", "hyperparameters.json")) as f:
            hps = {k: train.decode(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        pass  # the runtime names a bad file when the script's DataLoader starts
    # troupe_* hyperparameters as TROUPE_* (troupe_node_restarts among them), as troupe's train
    # gives them, and torchrun's variables for a DDP script.
    env = train.torchrun_env(train.troupe_env(root, hps, dict(os.environ)))
    if "TROUPE_DIE_WITH_PARENT" in env:
        # Under troupe sim, with the toolkit between: the loop dies with the toolkit.
        env["TROUPE_DIE_WITH_PARENT"] = str(os.getppid())
    text = str(env.get("TROUPE_NODE_RESTARTS", "2"))
    restarts = int(text) if text.isdigit() else 2
    if not text.isdigit():
        print("troupe.data: hyperparameter troupe_node_restarts (TROUPE_NODE_RESTARTS) '%s' is not "
              "a whole number; 2 restarts instead (give how many times a lost data process is "
              "started again, e.g. 2)" % text, file=sys.stderr, flush=True)
    print("troupe.data: %s was started by another program (pid %d, %s): troupe restarts its "
          "process on a data instance when a signal kills it (troupe_node_restarts %d)"
          % (os.path.basename(sys.argv[0]), os.getppid(), _name(os.getppid()), restarts),
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    code = train.supervise(sys.executable, sys.orig_argv[1:], env, restarts)
    sys.stderr.flush()
    os._exit(code)


def _name(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
        return " ".join(os.path.basename(w) for w in words[:2]) or "?"
    except OSError:
        return "?"
