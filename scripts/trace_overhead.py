#!/usr/bin/env python3
"""What --trace costs hetero_train: samples/s with and without it (docs/tracing.md, "Overhead").

Runs the same hetero_train job under `troupe sim` in pairs, one run without --trace and one with
it, the order alternating from pair to pair so that a slow spell of the machine falls on both
sides. Throughput is hetero_train's own (its --report: samples over epoch seconds, so cluster
formation and start-up are not in it). Prints one JSON line per run, then the median of each side
and the overhead: 1 - median(with) / median(without). Run it on a quiet machine: another process
on the same cores moves single runs by more than the 3% this measures.

    scripts/trace_overhead.py --build build [--pairs 5] [--epochs 2] [--samples 24000] \\
        [--sim-args "--group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge --pin"] \\
        [--app-args "--augmenters-per-node 2"]
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def run_once(args, trace, workdir, index):
    report = os.path.join(workdir, f"report-{index}.json")
    cmd = [os.path.join(args.build, "troupe"), "sim"] + shlex.split(args.sim_args)
    trace_path = os.path.join(workdir, f"trace-{index}.json")
    if trace:
        cmd += ["--trace", trace_path]
    cmd += ["--", os.path.join(args.build, "apps/hetero_train/hetero_train"),
            "--epochs", str(args.epochs), "--train-samples", str(args.samples),
            "--report", report] + shlex.split(args.app_args)
    log = os.path.join(workdir, f"run-{index}.log")
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if code != 0:
        sys.exit(f"trace_overhead: run {index} ({'with' if trace else 'without'} --trace) exited "
                 f"with {code}; its output is in {log}")
    with open(report) as f:
        epochs = json.load(f)["epochs"]
    samples = sum(e["samples"] for e in epochs)
    seconds = sum(e["seconds"] for e in epochs)
    row = {"run": index, "trace": trace, "samples": samples, "seconds": round(seconds, 3),
           "samples_per_s": round(samples / seconds, 1)}
    if trace:
        with open(trace_path) as f:
            meta = json.load(f)["otherData"]["troupe"]
        row["spans"] = meta["spans"]
        row["dropped_spans"] = meta["dropped_spans"]
        row["trace_bytes"] = os.path.getsize(trace_path)
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="the build folder (troupe, hetero_train)")
    p.add_argument("--pairs", type=int, default=5, help="runs on each side")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=24000, help="--train-samples")
    p.add_argument("--sim-args", default="--group data_group=2:ml.c5.xlarge "
                   "--group dnn_group=1:ml.p3.2xlarge", help="troupe sim's options")
    p.add_argument("--app-args", default="", help="more hetero_train options")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--keep", help="keep logs, reports and traces in this folder")
    args = p.parse_args()
    if args.pairs < 1:
        sys.exit("trace_overhead: --pairs must be at least 1")
    workdir = args.keep or tempfile.mkdtemp(prefix="troupe-trace-overhead-")
    os.makedirs(workdir, exist_ok=True)
    rows = []
    for pair in range(args.pairs):
        order = [False, True] if pair % 2 == 0 else [True, False]
        for trace in order:
            rows.append(run_once(args, trace, workdir, len(rows) + 1))
    without = statistics.median(r["samples_per_s"] for r in rows if not r["trace"])
    with_trace = statistics.median(r["samples_per_s"] for r in rows if r["trace"])
    print(json.dumps({"pairs": args.pairs, "median_samples_per_s_without": without,
                      "median_samples_per_s_with": with_trace,
                      "overhead_percent": round(100 * (1 - with_trace / without), 2),
                      "target_percent": 3}))
    if not args.keep:
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)


if __name__ == "__main__":
    main()
