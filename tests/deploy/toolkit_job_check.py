#!/usr/bin/env python3
"""A troupe job launched as the SageMaker PyTorch estimator launches it in AWS's own images: PyPI's
sagemaker-training toolkit (its `train`) as every instance's entry point, under `troupe sim
--netns` (each instance its own network, its host name resolving as on SageMaker: the toolkit
waits for every host's name before it runs the script).

The user's script is tests/image/pytorch/train.py (its own argparse, SM_CHANNEL_TRAIN,
SM_MODEL_DIR, troupe.data.DataLoader its one troupe line), shipped as the SDK ships it:
`sagemaker_program` and `sagemaker_submit_directory` JSON-encoded in hyperparameters.json, with a
requirements.txt naming troupe's wheel when --wheel gives one (the toolkit pip-installs it on
every instance), else troupe's package from --pythonpath. With --kill, a seeded moment inside the
first epoch, the process serving one data instance's DataLoader workers is SIGKILLed.

The oracle is this script's, not troupe's: every instance's exit status as troupe sim read it from
the OS, the toolkit's own "Reporting training SUCCESS" on each, the kill seen to happen (the pid
gone, the restart announced), every sample of every epoch trained once (counted here from the ids
the script trained on), and no process left behind.

usage: toolkit_job_check.py --troupe BUILD/troupe --venv VENV [--venv-per-host]
                            [--pythonpath DIR | --wheel WHEEL] [--kill] [--seed N] [--no-loop]
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import sim_check  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "image", "pytorch", "train.py")
EPOCHS, SAMPLES, BATCH = 2, 3000, 50


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(e.decode(errors="replace").partition("=")[::2]
                        for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return {}


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def serving_process(session, root):
    """The process that runs the script's troupe node on the instance whose root is `root`: the
    child of troupe.data's restart loop (the script's process the toolkit started), itself
    running train.py; with no loop, the script's process itself."""
    scripts = [p for p in sim_check.session_members(session)
               if "train.py" in " ".join(cmdline_of(p)[1:3])
               and environ_of(p).get("TROUPE_SM_ROOT") == root]
    loops = {p for p in scripts if "TROUPE_SUPERVISOR" not in environ_of(p)}
    served = [p for p in scripts if parent_of(p) in loops and "TROUPE_SUPERVISOR" in environ_of(p)]
    if not served:  # no loop (--no-loop): the script's process the toolkit started
        served = [p for p in scripts if parent_of(p) not in scripts]
    return served[0] if len(served) == 1 else None


def exactly_once(path):
    if not os.path.exists(path):
        return f"the head wrote no {path}"
    with open(path) as f:
        ids = json.load(f)
    if sorted(ids) != [str(e) for e in range(EPOCHS)]:
        return f"ids.json has epochs {sorted(ids)}, not 0..{EPOCHS - 1}"
    for epoch, got in sorted(ids.items()):
        dup = len(got) - len(set(got))
        missing = len(set(range(SAMPLES)) - set(got))
        if dup or missing or len(got) != SAMPLES:
            return (f"epoch {epoch}: {len(got)} ids, {dup} duplicates, {missing} missing "
                    f"(want {SAMPLES}, 0, 0)")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--troupe", required=True)
    ap.add_argument("--venv", required=True, help="a venv with sagemaker-training and torch; "
                    "with --venv-per-host, the folder of one such venv per host (algo-1, ...), "
                    "as each SageMaker instance has its own container")
    ap.add_argument("--venv-per-host", action="store_true")
    ap.add_argument("--pythonpath", help="troupe's package (the build's python/ folder)")
    ap.add_argument("--wheel", help="troupe's wheel, named by the source's requirements.txt")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-loop", action="store_true",
                    help="TROUPE_SUPERVISE=0 on every instance: troupe.data runs no restart loop "
                         "(to see this check fail)")
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("skipping: troupe sim --netns needs root and iproute2's ip (each instance's host "
              "name must resolve, as the toolkit waits for it)")
        return 77
    one = os.path.join(args.venv, "algo-1") if args.venv_per_host else args.venv
    command = [os.path.join(args.venv, "bin", "train")]
    if args.venv_per_host:  # the instance's own venv, named by its root's folder
        command = ["/bin/sh", "-c", 'exec "$0/$(basename "$TROUPE_SM_ROOT")/bin/train"',
                   os.path.abspath(args.venv)]
    if subprocess.run([os.path.join(one, "bin", "python"), "-c", "import torch"],
                      capture_output=True).returncode != 0:
        print(f"skipping: the venv {one} has no PyTorch (python3-torch, or PyPI's torch)")
        return 77
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    kill_step = rng.randrange(5, 50)  # of the 60 steps of the first epoch (2 data instances)
    print(f"toolkit_job_check: seed {seed}" +
          (f", a data instance's serving process SIGKILLed at the head's step {kill_step}"
           if args.kill else ""), flush=True)

    work = tempfile.mkdtemp(prefix="troupe-toolkit-")
    failures = []
    installed = 0
    state = {"roots": None, "head": None, "data": [], "killed": None, "why": None}
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        shutil.copy(SCRIPT, os.path.join(src, "train.py"))
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        if args.wheel:
            shutil.copy(args.wheel, src)
            with open(os.path.join(src, "requirements.txt"), "w") as f:
                f.write("./" + os.path.basename(args.wheel) + "\n")
        elif args.pythonpath:
            env["PYTHONPATH"] = os.path.abspath(args.pythonpath)

        def on_line(line, proc):
            words = line.split()
            if line.startswith("troupe sim: ") and " roots in " in line:
                state["roots"] = line.rsplit(" roots in ", 1)[1].strip()
            elif line.startswith("troupe sim: algo-") and len(words) > 3:
                if words[3] == "dnn_group":
                    state["head"] = words[2]
                else:
                    state["data"].append(words[2])
            if (args.kill and state["killed"] is None and state["why"] is None
                    and line.startswith(f"[{state['head']}] progress: epoch 1/")
                    and int(line.split("step ")[1].split("/")[0]) >= kill_step):
                victim = state["data"][0]
                root = os.path.join(state["roots"], victim)
                pid = serving_process(proc.pid, root)
                if pid is None:
                    state["why"] = f"no single serving process of {victim} ({root}) to kill"
                    return
                what = " ".join(cmdline_of(pid)[:2])
                os.kill(pid, signal.SIGKILL)
                state["killed"] = pid
                print(f"toolkit_job_check: SIGKILL to pid {pid} ({what}), {victim}'s serving "
                      f"process, at the head's {line.split('] ', 1)[1].strip()}", flush=True)

        hps = {"sagemaker_program": "train.py", "sagemaker_submit_directory": src,
               "epochs": EPOCHS, "samples": SAMPLES, "batch-size": BATCH, "sleep-ms": 2}
        options = ["--netns", "--keep", "--channel", "train=/usr/share/datasets/fashion-mnist"]
        if args.no_loop:
            options += ["--env", "data_group:TROUPE_SUPERVISE=0", "--env",
                        "dnn_group:TROUPE_SUPERVISE=0"]
        for k, v in hps.items():  # JSON-encoded, as the SageMaker SDK writes them
            options += ["--hp", f"{k}={json.dumps(v)}"]
        build = os.path.dirname(os.path.abspath(args.troupe))
        started = time.monotonic()
        code, out = sim_check.sim(build, command, env, data=2, dnn=1, options=options,
                                  timeout=400, on_line=on_line)
        print("".join(l for l in out.splitlines(True) if " progress: " not in l)[-6000:])
        print(f"toolkit_job_check: troupe sim exited {code} after {time.monotonic() - started:.1f} s")
        if code != 0:
            failures.append(f"troupe sim exited {code}; every instance must exit 0")
        if "troupe sim: all 3 instances exited 0" not in out:
            failures.append("troupe sim did not report all 3 instances exited 0")
        for host in ("algo-1", "algo-2", "algo-3"):
            if f"[{host}] " not in out or not any(
                    l.startswith(f"[{host}] ") and "Reporting training SUCCESS" in l
                    for l in out.splitlines()):
                failures.append(f"{host}: the toolkit did not report training SUCCESS")
        if "Invoking script with the following command" not in out:
            failures.append("the toolkit never invoked the script")
        installed = len(re.findall(r"Successfully installed [^\n]*troupe-", out))
        if args.wheel and installed != 3:
            failures.append(f"the toolkit installed troupe's wheel from requirements.txt on "
                            f"{installed} of 3 instances")
        if "was started by another program" not in out:
            failures.append("troupe.data did not see that the toolkit started the script")
        if args.kill:
            if state["why"]:
                failures.append(state["why"])
            elif state["killed"] is None:
                failures.append(f"the kill never happened (the head's step {kill_step} of epoch 1 "
                                f"never came)")
            else:
                if os.path.exists(f"/proc/{state['killed']}") and \
                        (parent_of(state["killed"]) or 0) > 1:
                    failures.append(f"pid {state['killed']} outlived its SIGKILL")
                if "was killed by SIGKILL; starting it again (restart 1 of 2)" not in out:
                    failures.append(f"no restart of {state['data'][0]}'s process was announced")
        if state["roots"]:
            why = exactly_once(os.path.join(state["roots"], state["head"] or "?", "output",
                                            "data", "ids.json"))
            if why:
                failures.append(why)
        else:
            failures.append("troupe sim printed no roots line")
    finally:
        roots = state["roots"]
        if roots and os.path.basename(roots).startswith("troupe-sim-"):
            shutil.rmtree(roots, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return sim_check.verdict(
        "toolkit_job_check", failures,
        f"3 instances started by sagemaker-training's train exited 0, {EPOCHS} epochs of "
        f"{SAMPLES} samples each trained once" + (
            f", the wheel installed from requirements.txt on {installed}" if args.wheel else "") + (
            f", {state['data'][0] if state['data'] else '?'}'s process killed and restarted"
            if args.kill else "") + f" (seed {seed})")


if __name__ == "__main__":
    sys.exit(main())
