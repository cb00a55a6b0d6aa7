#!/usr/bin/python3
"""bench_pytorch: the seeds' PyTorch example fed by troupe's data group, against the same script
with a DataLoader on the dnn instance's own CPUs, and troupe.data's per-batch cost against
hetero_train's C++ trainer - all in one run, each instance with its type's share of this machine
(troupe sim --cpu-scale, as `make run`).

  heterogeneous   troupe sim, data_group=2:ml.c5.xlarge + dnn_group=1:ml.p3.2xlarge:
                  examples/pytorch/train.py (troupe.data)
  homogeneous     troupe sim, dnn_group=1:ml.p3.2xlarge alone at the same scale:
                  examples/pytorch/train_plain.py, DataLoader(num_workers=--workers)
  C++ trainer     hetero_train on the heterogeneous cluster (same epochs, samples, augmentation)

ms/step, samples/s and data wait are the scripts' own (their --report: each epoch's time and the
time spent waiting in the batch iterator); hetero_train's come from its report (mean_step_ms,
samples_per_s, data_wait_fraction, as make compare reads them). "handoff" is the
trainer's per-batch cost beyond the step where the batch was already queued (docs/pytorch.md):
for troupe.data from the script asking for the next batch to holding it as tensors, for
hetero_train from one pool step's end to the next one's start.

Usage: bench_pytorch.py [--build DIR] [--rounds N] [--epochs N] [--train-samples N]
                        [--workers N] [--json]
Exits 1 when any run fails (an instance exits non-zero, or a sample is missing or duplicated).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
CLUSTER = ["--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge"]
CLUSTER_VCPUS = 2 * 4 + 8
PYTHON = "/usr/bin/python3"


def run(build, sim_args, app, report, env=None):
    argv = [os.path.join(build, "troupe"), "sim", "--node-restarts=0"] + sim_args + ["--"] + app
    full_env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), **(env or {}))
    done = subprocess.run(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0 or not os.path.exists(report):
        sys.stderr.write(done.stdout[-4000:])
        raise SystemExit(f"bench_pytorch: {' '.join(app[:2])} exited {done.returncode}")
    with open(report) as f:
        return json.load(f)


def steady(epochs):
    # The script's figures over its epochs: ms per step, samples/s, data wait.
    seconds = sum(e["seconds"] for e in epochs)
    steps = sum(e["steps"] for e in epochs)
    wait = sum(e["wait_seconds"] for e in epochs)
    return seconds, steps, wait


def check_once(stream_report, epochs, samples):
    for e in stream_report["epochs"]:
        if e["samples"] != samples or e["duplicates"] or e["missing"]:
            raise SystemExit(f"bench_pytorch: epoch {e['epoch'] + 1} was not every sample once: "
                             f"{e['samples']} samples, {e['duplicates']} duplicates, "
                             f"{e['missing']} missing")
    if len(stream_report["epochs"]) != epochs:
        raise SystemExit("bench_pytorch: the stream reported %d epochs, not %d"
                         % (len(stream_report["epochs"]), epochs))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-samples", type=int, default=0)
    p.add_argument("--workers", type=int, default=8,
                   help="the homogeneous DataLoader's workers (default: the instance's 8 vCPUs)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    build = os.path.abspath(args.build)
    scale = min(1.0, os.cpu_count() / CLUSTER_VCPUS)
    samples = args.train_samples or 60000
    common = ["--epochs", str(args.epochs), "--train-samples", str(args.train_samples)]
    rows = {"troupe": [], "dataloader": [], "cpp": []}
    with tempfile.TemporaryDirectory(prefix="bench-pytorch-") as tmp:
        for r in range(args.rounds):
            report = os.path.join(tmp, f"troupe-{r}.json")
            j = run(build, ["--cpu-scale", str(scale)] + CLUSTER,
                    [PYTHON, os.path.join(SOURCE, "examples/pytorch/train.py"), "--report", report]
                    + common, report)
            check_once(j["stream"], args.epochs, samples)
            seconds, steps, wait = steady(j["epochs"])
            rows["troupe"].append({"seconds": seconds, "steps": steps, "wait_seconds": wait,
                                   "handoff_us": j["stream"]["handoff_us_per_batch"],
                                   "accuracy": j["epochs"][-1]["accuracy"]})

            report = os.path.join(tmp, f"plain-{r}.json")
            j = run(build, ["--cpu-scale", str(scale), "--group", "dnn_group=1:ml.p3.2xlarge"],
                    [PYTHON, os.path.join(SOURCE, "examples/pytorch/train_plain.py"), "--report",
                     report, "--workers", str(args.workers)] + common, report)
            seconds, steps, wait = steady(j["epochs"])
            rows["dataloader"].append({"seconds": seconds, "steps": steps, "wait_seconds": wait,
                                       "handoff_us": None,
                                       "accuracy": j["epochs"][-1]["accuracy"]})

            report = os.path.join(tmp, f"cpp-{r}.json")
            j = run(build, ["--cpu-scale", str(scale)] + CLUSTER,
                    [os.path.join(build, "apps/hetero_train/hetero_train"), "--report", report,
                     "--augment", "heavy"] + common, report)
            check_once(j, args.epochs, samples)
            rows["cpp"].append({"ms_per_step": j["mean_step_ms"],
                                "samples_per_second": j["samples_per_s"],
                                "data_wait": j["data_wait_fraction"],
                                "handoff_us_per_batch": j["trainer_cpu"]["handoff_us_per_batch"],
                                "test_accuracy": j["epochs"][-1]["test_accuracy"]})

    def figures(row):
        return {"ms_per_step": 1000 * row["seconds"] / row["steps"],
                "samples_per_second": samples * args.epochs / row["seconds"],
                "data_wait": row["wait_seconds"] / row["seconds"],
                "handoff_us_per_batch": row["handoff_us"],
                "test_accuracy": row["accuracy"]}

    result = {"cpu_scale": scale, "epochs": args.epochs, "samples": samples,
              "workers": args.workers, "rounds": []}
    for r in range(args.rounds):
        t, d = (figures(rows[k][r]) for k in ("troupe", "dataloader"))
        c = rows["cpp"][r]  # hetero_train's own report, as make compare reads it
        result["rounds"].append({"troupe_data": t, "dataloader": d, "hetero_train": c,
                                 "speedup": d["ms_per_step"] / t["ms_per_step"]})
    if args.json:
        print(json.dumps(result))
        return
    print(f"bench_pytorch: {args.epochs} epoch(s) of {samples} samples, heavy augmentation, "
          f"{scale:g} CPU of this machine per vCPU (troupe sim --cpu-scale)\n")
    print(f"{'round':<6} {'setup':<44} {'ms/step':>8} {'samples/s':>10} {'data wait':>10} "
          f"{'handoff us':>11} {'accuracy':>9}")
    names = {"troupe_data": "PyTorch, troupe data group (2x c5.xlarge)",
             "dataloader": f"PyTorch, DataLoader({args.workers} workers), p3 alone",
             "hetero_train": "hetero_train's C++ trainer, troupe data group"}
    for i, rnd in enumerate(result["rounds"]):
        for key, name in names.items():
            f = rnd[key]
            handoff = "-" if f["handoff_us_per_batch"] is None else f"{f['handoff_us_per_batch']:.0f}"
            print(f"{i + 1:<6} {name:<44} {f['ms_per_step']:>8.1f} {f['samples_per_second']:>10.0f} "
                  f"{100 * f['data_wait']:>9.0f}% {handoff:>11} {f['test_accuracy']:>9.4f}")
        print(f"{'':<6} troupe data group vs DataLoader: {rnd['speedup']:.2f}x faster per step\n")


if __name__ == "__main__":
    main()
