#!/usr/bin/env python3
"""What one interruption costs hetero_train, against the checkpoint interval.

For each interval (steps between checkpoints; 0 = only the one written on SIGTERM) this runs the
job under `troupe sim` three ways, each from an empty checkpoint folder:

  plain     never interrupted: the wall time, and what writing the checkpoints cost;
  sigterm   interrupted as SageMaker reclaims spot capacity (SIGTERM to every instance; the
            trainer writes a checkpoint before it exits), then started again;
  sigkill   interrupted without a grace period (SIGKILL; the capacity is simply gone): the work
            since the last periodic checkpoint is lost.

Time lost = the interrupted job's wall time (both runs, simulator start to exit) minus the plain
run's at the same interval. Steps redone = training steps the interrupted run had done (its last
progress line, every 0.1 s) minus the step it resumed from.

    scripts/resume_bench.py --build build [--samples 60000] [--epochs 5] [--intervals 0,20,100,500] \\
        [--after "progress: epoch 3/"] [--after-ms 500,1000,1500]

The interrupted runs are interrupted at each of --after-ms milliseconds after the first line
containing --after. Prints a Markdown table (docs/hetero_train.md, "Checkpoints and resume", has a measured one).
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
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return time.monotonic() - start, p.returncode, p.stdout


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
    args = ap.parse_args()
    troupe = os.path.join(args.build, "troupe")
    app = os.path.join(args.build, "apps/hetero_train/hetero_train")
    moments = [int(m) for m in args.after_ms.split(",")]
    work = tempfile.mkdtemp(prefix="troupe-resume-bench-")
    rows = []

    def job(interval, mode, moment):
        ck = os.path.join(work, "ck-%d-%s-%d" % (interval, mode, moment))
        report = os.path.join(work, "report.json")
        sim = [troupe, "sim", "--group", "data_group=2:ml.c5.xlarge", "--group",
               "dnn_group=1:ml.p3.2xlarge", "--checkpoints", ck]
        if mode != "plain":
            sim += ["--interrupt-after-ms", str(moment), "--interrupt-when", args.after,
                    "--restarts-on-interrupt", "1"]
        if mode == "sigkill":
            sim += ["--interrupt-hard"]
        cmd = sim + ["--", app, "--epochs", str(args.epochs), "--train-samples",
                     str(args.samples), "--progress-every", "0.1", "--checkpoint-every",
                     str(interval), "--report", report]
        seconds, code, out = run(cmd)
        if code != 0:
            sys.exit("%s failed with %d:\n%s" % (" ".join(cmd), code, out[-3000:]))
        j = json.load(open(report))
        shutil.rmtree(ck, ignore_errors=True)
        # The first run's last progress line: after SIGKILL nothing more comes, after SIGTERM
        # the checkpoint written on stop holds at least as much.
        first = out.split("starting the job again")[0]
        done = [int(x) for x in re.findall(r"progress: epoch \d+/\d+, step (\d+)/", first)]
        resumed = (j["resumed_from"] or {}).get("step", 0)
        return seconds, j, max(0, (done[-1] if done else 0) - resumed)

    try:
        for interval in [int(i) for i in args.intervals.split(",")]:
            seconds, j, _ = job(interval, "plain", 0)
            row = {"interval": interval, "plain": seconds, "written": j["checkpoints_written"],
                   "write_s": j["checkpoint_write_seconds"], "step_ms": j["mean_step_ms"]}
            for mode in ("sigterm", "sigkill"):
                lost, redone = [], []
                for moment in moments:
                    s2, _, r = job(interval, mode, moment)
                    lost.append(s2 - seconds)
                    redone.append(r)
                row[mode] = {"lost_s": lost, "redone": redone}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| interval (steps) | uninterrupted | checkpoints written | SIGTERM: time lost | "
          "SIGKILL: time lost | SIGKILL: steps redone |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        t, k = r["sigterm"], r["sigkill"]
        print("| %s | %.1f s (%.1f ms/step) | %d, %.2f s | %.1f s (%s) | %.1f s (%s) | %.0f (%s) |" % (
            r["interval"] or "0 (on SIGTERM only)", r["plain"], r["step_ms"], r["written"],
            r["write_s"], mean(t["lost_s"]), ", ".join("%.1f" % x for x in t["lost_s"]),
            mean(k["lost_s"]), ", ".join("%.1f" % x for x in k["lost_s"]), mean(k["redone"]),
            ", ".join(str(x) for x in k["redone"])))


if __name__ == "__main__":
    main()
