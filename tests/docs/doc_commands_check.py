#!/usr/bin/env python3
"""Every shell command of a doc page (its ```sh blocks) run as a reader runs it, or skipped with
the reason on one line.

A command is run from a work folder that looks like the repository to it: build/ is the build
folder under test, deploy/, examples/ and tests/ are the repository's, and src/ and data/train
hold a script-mode script and its data (tests/image/pytorch/train.py, Fashion-MNIST), as the page
has the reader put them. The page's placeholders get stand-ins (IMAGE_URI, ROLE_ARN, BUCKET), and
a launch.py command that would call AWS runs with --dry-run instead of --wait (no AWS account
here): its request must be JSON on stdout. A `make` command runs with BUILD= the build folder.
What cannot run here is skipped and says why: the container image (CI's image phase builds and
runs it), a GPU, a PID of an earlier run, a wheel not built.

Each command's verdict is one line (PASS, FAIL or SKIP, the command, why); exit 0 when none
failed.

usage: doc_commands_check.py --build BUILD --repo REPO PAGE.md...
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

STANDINS = {"IMAGE_URI": "troupe-train:latest", "ROLE_ARN": "arn:aws:iam::000000000000:role/x",
            "BUCKET": "bucket"}
# `python3 deploy/sagemaker/launch.py ... --flag`: the `...` is the page's first launch command's
# arguments.
LAUNCH_BASE = "--image IMAGE_URI --role ROLE_ARN --data s3://BUCKET/fashion-mnist/"

# (pattern, why): a command matching the pattern is skipped, the line says why.
SKIPS = [
    (r"^make (image|test-image)\b", "builds or runs the container image (about 25 min): CI's "
                                    "image phase runs make image and make test-image"),
    (r"^docker run .*--gpus", "needs a GPU machine with the CUDA image (docs/benchmarks.md, "
                              "'The dnn group on a GPU', scripts/gpu-check.sh)"),
    (r"dist/troupe-[^ ]*\.whl", "needs make wheel's dist/ (make test-wheel installs the wheel "
                                "the same way, tests/wheel/wheel_test.sh)"),
]


def blocks(path):
    """The page's ```sh blocks, each the list of its shell commands (continuation lines joined,
    comments cut)."""
    text = open(path).read()
    found = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang not in ("sh", "bash", "shell"):
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        commands = []
        for line in body.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
        found.append(commands)
    return found


def rewrite(command, kept):
    """The command as this check runs it, or (None, why) for one it skips. `kept`: the roots
    folder of the last troupe sim run with --keep, for the page's /tmp/troupe-sim-PID/."""
    for pattern, why in SKIPS:
        if re.search(pattern, command):
            return None, why
    if "/tmp/troupe-sim-PID/" in command:
        if kept is None:
            return None, "names the roots of an earlier troupe sim --keep, and none ran before it"
        command = command.replace("/tmp/troupe-sim-PID/", kept + "/")
    if "deploy/sagemaker/launch.py" in command:
        command = command.replace("launch.py ...", "launch.py " + LAUNCH_BASE)
        command = re.sub(r"\[(--[^\]]+)\]", r"\1", command)  # an optional flag: given
        command = command.replace(" --wait", "") + " --dry-run"
    for name, value in STANDINS.items():
        command = command.replace(name, value)
    return command, None


def workspace(repo, build):
    work = tempfile.mkdtemp(prefix="troupe-doc-")
    os.symlink(os.path.abspath(build), os.path.join(work, "build"))
    for name in ("deploy", "examples", "tests", "scripts", "apps", "Makefile", "CMakeLists.txt"):
        os.symlink(os.path.join(repo, name), os.path.join(work, name))
    os.makedirs(os.path.join(work, "src"))
    shutil.copy(os.path.join(repo, "tests", "image", "pytorch", "train.py"),
                os.path.join(work, "src", "train.py"))
    os.makedirs(os.path.join(work, "data"))
    os.symlink("/usr/share/datasets/fashion-mnist", os.path.join(work, "data", "train"))
    return work


def judge(command, code, out):
    """Why a run that exited `code` with `out` is wrong, or None."""
    if code != 0:
        return f"exited {code}; its output ends: " + " | ".join(out.strip().splitlines()[-6:])
    if "launch.py" in command and "--dry-run" in command:
        try:
            request = json.loads(out.split("\n__stderr__\n")[0])
        except ValueError as e:
            return f"--dry-run's stdout is not one JSON object ({e})"
        if "TrainingJobName" not in request:
            return "--dry-run's JSON has no TrainingJobName"
    if " sim " in command and "instances exited 0" not in out:
        return "troupe sim did not say every instance exited 0"
    return None


def run(command, work, env):
    """(exit code, stdout + a marker + stderr, seconds) of `command` run by bash in `work`."""
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                          text=True, errors="replace", timeout=900)
    return (proc.returncode, proc.stdout + "\n__stderr__\n" + proc.stderr,
            time.monotonic() - started)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("pages", nargs="+")
    args = ap.parse_args()
    build, repo = os.path.abspath(args.build), os.path.abspath(args.repo)
    if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"],
                      capture_output=True).returncode != 0:
        print("skipping: the pages' scripts need PyTorch and torchvision for /usr/bin/python3 "
              "(python3-torch python3-torchvision)")
        return 77
    work = workspace(repo, build)
    env = dict(os.environ, PATH="/usr/bin:/bin:/usr/sbin:/sbin", PYTHONUNBUFFERED="1",
               HOME=work)
    env.pop("PYTHONPATH", None)
    failed = ran = skipped = 0
    kept = []  # the roots troupe sim --keep left, removed at the end
    try:
        for page in args.pages:
            for block in blocks(os.path.join(repo, page)):
                # A reader types a block's lines into one shell: what `.` and `export` set holds
                # for the lines after it, and a line skipped skips those after it.
                sourced, after = [], None
                for original in block:
                    command, why = rewrite(original, kept[-1] if kept else None)
                    if command is not None and after is not None:
                        command, why = None, f"follows a skipped line of its block: {after}"
                    if command is None:
                        skipped += 1
                        after = after or original
                        print(f"SKIP {page}: {original}\n     why: {why}", flush=True)
                        continue
                    if command.startswith("make "):
                        command += f" BUILD={build}"
                    code, out, seconds = run("\n".join(sourced + [command]), work, env)
                    if re.match(r"^(\.|source|export) ", command):
                        sourced.append(command)
                    if " --keep" in command:
                        kept += re.findall(r"roots in (/tmp/troupe-sim-[0-9]+)", out)[:1]
                    why = judge(command, code, out)
                    ran += 1
                    if why:
                        failed += 1
                        print(f"FAIL {page}: {original}\n     ran: {command}\n     why: {why}",
                              flush=True)
                    else:
                        print(f"PASS {page}: {original} ({seconds:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for roots in kept:
            shutil.rmtree(roots, ignore_errors=True)
    print(f"doc_commands_check: {ran} commands run, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
