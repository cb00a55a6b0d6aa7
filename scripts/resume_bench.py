#!/usr/bin/env python3
"""What one interruption costs hetero_train, against the checkpoint interval.

For each interval (steps between checkpoints; 0 = only the one written on SIGTERM) this runs the
job under `troupe sim` from an empty checkpoint folder, never interrupted and then interrupted
(each at several moments) and started again (--restarts-on-interrupt 1), two ways:

  SIGTERM   as SageMaker reclaims spot capacity: the trainer writes a checkpoint as the job
            ends, so only the stop and the restart are lost;
  SIGKILL   capacity lost without a grace period (--interrupt-hard): the steps trained since the
            last periodic checkpoint are lost too and trained again.

The time lost to the interruption is measured inside the interrupted job, from the moment the
simulator printed each line (so another process slowing down a different run does not enter):

  stop + restart  from the interruption to the resumed trainer's "resumed from checkpoint" (or
                  "no checkpoint") line: the processes ending, the checkpoint written, the
                  job started again, cluster formed, dataset loaded, checkpoint read;
  redone          the training the resumed run had to do again: from the interrupted run's last
                  "checkpoint ... written" line (or its first "no checkpoint" line: training
                  started) to the interruption; 0 after SIGTERM, whose checkpoint holds every
                  step. Also in steps: the interrupted run's last progress line (every 0.1 s, so
                  it may be a few steps short) minus the step the job resumed from.

and the cost of the checkpoints themselves from the uninterrupted run's report
(checkpoint_write_seconds: the time training waited for writes).

    scripts/resume_bench.py --build build [--samples 60000] [--epochs 5] \\
        [--intervals 0,20,100,500] [--after "progress: epoch 3/"] [--after-ms 500,1000,1500]

Prints a Markdown table (docs/hetero_train.md, "What one interruption costs", has a measured
one) after a JSON line per interval.
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


def run(cmd):
    """Runs cmd; returns (wall seconds, exit code, [(seconds since start, line), ...])."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - start, line) for line in p.stdout]
    code = p.wait()
    return time.monotonic() - start, code, lines


def first(lines, pattern, after=0.0):
    for t, line in lines:
        if t >= after and re.search(pattern, line):
            return t
    return None


def mean(values):
    return sum(values) / len(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--intervals", default="0,20,100,500")
    ap.add_argument("--after", default="progress: epoch 3/",
                    help="the interruption's clock starts at this line")
    ap.add_argument("--after-ms", default="500,1000,1500",
                    help="the moments (ms after --after): one interrupted run each")
    ap.add_argument("--from-log", metavar="FILE",
                    help="print the table again from the JSON lines of an earlier run's output")
    args = ap.parse_args()
    if args.from_log:
        print_table([json.loads(l) for l in open(args.from_log) if l.startswith("{")])
        return
    troupe = os.path.join(args.build, "troupe")
    app = os.path.join(args.build, "apps/hetero_train/hetero_train")
    moments = [int(m) for m in args.after_ms.split(",")]
    work = tempfile.mkdtemp(prefix="troupe-resume-bench-")

    def job(interval, mode, moment=0):
        ck = os.path.join(work, "ck")
        shutil.rmtree(ck, ignore_errors=True)
        report = os.path.join(work, "report.json")
        cmd = [troupe, "sim", "--group", "data_group=2:ml.c5.xlarge", "--group",
               "dnn_group=1:ml.p3.2xlarge", "--checkpoints", ck, "--out", os.path.join(work, "out")]
        if mode != "plain":
            cmd += ["--interrupt-after-ms", str(moment), "--interrupt-when", args.after,
                    "--restarts-on-interrupt", "1"]
        if mode == "sigkill":
            cmd += ["--interrupt-hard"]
        cmd += ["--", app, "--epochs", str(args.epochs), "--train-samples", str(args.samples),
                "--progress-every", "0.1", "--checkpoint-every", str(interval), "--report", report]
        seconds, code, lines = run(cmd)
        if code != 0:
            sys.exit("%s failed with %d:\n%s" % (" ".join(cmd), code,
                                                 "".join(l for _, l in lines[-40:])))
        return seconds, json.load(open(report)), lines

    rows = []
    try:
        for interval in [int(i) for i in args.intervals.split(",")]:
            seconds, j, _ = job(interval, "plain")
            row = {"interval": interval, "plain_s": seconds, "step_ms": j["mean_step_ms"],
                   "written": j["checkpoints_written"], "write_s": j["checkpoint_write_seconds"]}
            for mode in ("sigterm", "sigkill"):
                row[mode] = []
                for moment in moments:
                    total, r, lines = job(interval, mode, moment)
                    t_int = first(lines, r"troupe sim: interrupting the job")
                    t_again = first(lines, r"starting the job again", t_int)
                    t_resumed = first(lines, r"resumed from checkpoint|no checkpoint in", t_again)
                    done = [int(s) for t, l in lines if t < t_again
                            for s in re.findall(r"progress: epoch \d+/\d+, step (\d+)/", l)]
                    resumed = (r["resumed_from"] or {}).get("step", 0)
                    redone = max(0, (done[-1] if done else 0) - resumed)
                    saved = [t for t, l in lines if t < t_int and
                             re.search(r"written \(every|no checkpoint in", l)]
                    redone_s = 0.0 if mode == "sigterm" else t_int - saved[-1]
                    row[mode].append({"stop_s": t_again - t_int, "restart_s": t_resumed - t_again,
                                      "redone": redone, "redone_s": redone_s,
                                      "wall_s": total, "resumed": resumed})
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()

    print_table(rows)


def print_table(rows):
    def lost(runs):
        return [x["stop_s"] + x["restart_s"] + x["redone_s"] for x in runs]

    print("| checkpoint every | uninterrupted run | checkpoint writes | SIGTERM: stop + "
          "restart | SIGTERM: time lost | SIGKILL: stop + restart | SIGKILL: redone | "
          "SIGKILL: time lost |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        t, k = r["sigterm"], r["sigkill"]
        print("| %s | %.1f s, %.1f ms/step | %d, %.2f s | %.1f + %.1f s | %.1f s | %.1f + %.1f s "
              "| %s s (%s steps) | %.1f s |" % (
                  "%d steps" % r["interval"] if r["interval"] else "never (SIGTERM only)",
                  r["plain_s"], r["step_ms"], r["written"], r["write_s"],
                  mean([x["stop_s"] for x in t]), mean([x["restart_s"] for x in t]),
                  mean(lost(t)), mean([x["stop_s"] for x in k]),
                  mean([x["restart_s"] for x in k]),
                  ", ".join("%.2f" % x["redone_s"] for x in k),
                  ", ".join(str(x["redone"]) for x in k), mean(lost(k))))


if __name__ == "__main__":
    main()
