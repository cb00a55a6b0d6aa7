"""What the checks that run a script under `troupe sim` share (memory_check.py, straggler_check.py,
spawn_check.py, translate_check.py): the processes of a session and their RSS read from /proc,
one job started in a session of its own and reaped whatever happens, and the verdict printed with
the first failure on the first line.
"""
import os
import signal
import subprocess
import sys
import threading
import time

DATA, DNN = "ml.c5.xlarge", "ml.p3.2xlarge"


def session_members(sid):
    """The pids of the processes in session `sid`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # the session id (field 6 of stat)
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return pids


def rss_and_name(pid):
    """A process's resident bytes and its command line (shortened), or (None, None)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        return rss, " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))[:90]
    except (OSError, StopIteration):
        return None, None


def setup(parser=None):
    """--build (and `parser`'s own arguments) parsed; exits 77 with the skip's line where this
    python3 has no PyTorch. Returns (the arguments, the build folder's absolute path)."""
    import argparse
    ap = parser or argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    skip = no_torch()
    if skip:
        sys.exit(skip)
    return args, os.path.abspath(args.build)


def no_torch():
    """77 with the skip's line where this python3 has no PyTorch, else None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipping: PyTorch is not installed for this python3 (python3-torch)")
        return 77
    return None


def environment(build, **extra):
    """The environment a script under troupe sim gets: the build's package first."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(build, "python")] + extra.pop("paths", [])), PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1", **extra)


def sim(build, script, env, data=1, dnn=1, options=(), timeout=400, on_line=None):
    """Runs `script` (this python3 runs it; a list: the command itself) under troupe sim with
    `data` data and `dnn` training instances (and `options` before the app) in a session of its own; `on_line(line, proc)` sees each line as it
    comes. Returns (exit code, output); a process left in the session is killed and named in the
    output, and makes the code non-zero."""
    argv = [os.path.join(build, "troupe"), "sim", *options,
            "--group", f"data_group={data}:{DATA}", "--group", f"dnn_group={dnn}:{DNN}",
            "--", *(script if isinstance(script, list) else [sys.executable, script])]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        lines.append(f"troupe sim was killed after {timeout} s\n")
    reader.join(10)
    left, settle = [], time.monotonic() + 5
    while time.monotonic() < settle:  # the instances' last processes end right after troupe sim
        left = session_members(proc.pid)
        if not left:
            break
        time.sleep(0.2)
    for pid in left:  # nothing may be left, but reap whatever is
        lines.append(f"process {pid} was left behind; killed\n")
        code = code or 1
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return code, "".join(lines)


def verdict(name, failures, ok):
    """Prints the failures (the first on the first line) or `ok`; the exit status."""
    if failures:
        print("FAILED: " + failures[0].splitlines()[0])
        for f in failures:
            print(f)
        return 1
    print(f"{name}: {ok}")
    return 0
