#!/usr/bin/python3
"""bench_ddp: each DDP rank's data wait with troupe.data.DataLoader, 2 ranks against 1, in the
same run (ddp_wait.py: train_images.py's ImageFolder and torchvision transforms on the data group;
on each rank a step of --step-ms, a sleep standing for a GPU's, then an all_reduce as DDP's):

  1 rank   troupe sim, data_group=2:ml.c5.xlarge on CPU 1 (their nodes and a worker each),
           dnn_group=1:ml.p3.2xlarge on CPU 0
  2 ranks  the same with dnn_group=2:ml.p3.2xlarge, both on CPU 0

The data group is the same in both (CPU 1); with 2 ranks it feeds twice the steps a second. Data
wait: the time a rank spends in next() on the loader, over the epochs after the first (which pays
the workers' start); "x 1 rank" is the slower rank's wait over the one rank's in the same round,
per batch (the issue's goal: no worse). Each epoch is split between the ranks, so a rank of 2 takes
half the batches; the wait is said per batch and as a share of the epoch's time.

Usage: bench_ddp.py [--build DIR] [--data DIR] [--rounds N] [--epochs N] [--step-ms T] [--json]
Exits 1 when a run fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
PYTHON = "/usr/bin/python3"
SCRIPT = os.path.join(HERE, "ddp_wait.py")


def run(build, ranks, data, report, args, env):
    argv = [os.path.join(build, "troupe"), "sim", "--node-restarts=0", "--cpu-scale", "off",
            "--group", "data_group=2:ml.c5.xlarge", "--group",
            f"dnn_group={ranks}:ml.p3.2xlarge", "--cpus", "data_group=1", "--cpus",
            "dnn_group=0", "--", PYTHON, SCRIPT, data, "--report", report, "--epochs",
            str(args.epochs), "--step-ms", str(args.step_ms)]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0 or not os.path.exists(report):
        sys.stderr.write(done.stdout[-4000:])
        raise SystemExit(f"bench_ddp: the {ranks}-rank run exited {done.returncode}")
    with open(report) as f:
        return json.load(f)


def steady(report):
    # Per rank over the epochs after the first: its wait per batch (ms) and as a share of the
    # epoch's time (%); and the images a second of all ranks together.
    later = report["epochs"][1:] or report["epochs"]
    seconds = sum(e["seconds"] for e in later)
    per_batch, share = [], []
    for r in range(report["ranks"]):
        wait = sum(e["wait_s"][r] for e in later)
        per_batch.append(1000 * wait / sum(e["batches"][r] for e in later))
        share.append(100 * wait / seconds)
    return per_batch, share, sum(e["samples"] for e in later) / seconds, report["agreement_us"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--data")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=150)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("bench_ddp: needs 2 CPUs (one for the data group, one for the ranks)")
    data = args.data or os.path.join(args.build, "images-data")
    if not os.path.isdir(os.path.join(data, "train")):
        subprocess.run([os.path.join(args.build, "apps", "hetero_train", "make_images"), data],
                       check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            one = steady(run(args.build, 1, data, os.path.join(tmp, f"one-{r}.json"), args, env))
            two = steady(run(args.build, 2, data, os.path.join(tmp, f"two-{r}.json"), args, env))
            rows.append({"round": r + 1,
                         "one_rank_wait_ms_per_batch": one[0][0], "one_rank_wait_pct": one[1][0],
                         "one_rank_images_per_s": one[2],
                         "two_ranks_wait_ms_per_batch": two[0], "two_ranks_wait_pct": two[1],
                         "two_ranks_images_per_s": two[2],
                         "stop_agreement_us_per_batch": two[3],
                         "ratio": max(two[0]) / one[0][0] if one[0][0] > 0 else None})
    summary = {"rounds": rows, "epochs": args.epochs, "step_ms": args.step_ms, "batch_size": 64,
               "data": data}
    ratios = sorted(r["ratio"] for r in rows if r["ratio"] is not None)
    summary["median_ratio"] = ratios[len(ratios) // 2] if ratios else None
    if args.json:
        print(json.dumps(summary))
        return
    print(f"data wait per rank (ms a batch, and % of the time; epochs 2-{args.epochs}, a step "
          f"of {args.step_ms:g} ms and an all_reduce a batch)")
    print("round  1 rank: ms  (%)    images/s   2 ranks: ms      (%)          images/s  x 1 rank")
    for r in rows:
        ms = ", ".join(f"{w:.1f}" for w in r["two_ranks_wait_ms_per_batch"])
        pct = ", ".join(f"{w:.0f}" for w in r["two_ranks_wait_pct"])
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        print(f"{r['round']:>5}  {r['one_rank_wait_ms_per_batch']:>10.1f} "
              f"({r['one_rank_wait_pct']:>3.0f})  {r['one_rank_images_per_s']:>8.0f}   {ms:>14} "
              f"({pct:>7})  {r['two_ranks_images_per_s']:>9.0f}  {ratio:>8}")
    if summary["median_ratio"] is not None:
        print(f"median: the slower rank of 2 waits {summary['median_ratio']:.2f}x what one rank "
              "waits a batch")
    agreement = ", ".join(f"{r['stop_agreement_us_per_batch']:.0f}" for r in rows)
    print(f"the ranks' stop agreement (in the 2 ranks' wait): {agreement} us a batch (a gloo "
          "all-reduce of one integer, mean of 500)")


if __name__ == "__main__":
    main()
