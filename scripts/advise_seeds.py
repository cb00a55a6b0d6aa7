#!/usr/bin/env python3
"""The sizing advisor on the seeds' two experiments (docs/advisor.md, "The seeds' two experiments").

For each experiment (TF: ml.p4d.24xlarge + ml.c5.18xlarge; PT: ml.p3.2xlarge + ml.c5.9xlarge):

1. From the seeds' published homogeneous step alone, scaled by vCPUs: a report holding only what
   that one run says (every vCPU of the GPU instance busy augmenting for the published step time)
   goes through `troupe advise`, which predicts the heterogeneous cluster's step; printed beside
   the published one.
2. With our measured rates (--report: a hetero_train --report of ours, e.g. blur 99): `troupe
   advise --dnn-type <the seeds' GPU instance> --types <their data instance>`, on the CPU as
   measured and, with --gpu-step-ms, as a what-if GPU trainer.

Usage: scripts/advise_seeds.py --troupe build/troupe [--report REPORT.json] [--gpu-step-ms MS]
Prints markdown tables.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# The seeds' tables (../shared/seeds, "Example 1 (TF)" and "Example 2 (PT)"): instance types,
# data-group size, published average step times (ms) and price per hour (USD, us-east-1 on-demand).
EXPERIMENTS = [
    {"name": "Example 1 (TF)", "dnn": "ml.p4d.24xlarge", "dnn_vcpus": 96, "data": "ml.c5.18xlarge",
     "data_count": 2, "hom_ms": 192, "het_ms": 86, "hom_price": 37.688, "het_price": 45.032},
    {"name": "Example 2 (PT)", "dnn": "ml.p3.2xlarge", "dnn_vcpus": 8, "data": "ml.c5.9xlarge",
     "data_count": 1, "hom_ms": 1193, "het_ms": 184, "hom_price": 3.825, "het_price": 5.661},
]


def advise(troupe, args):
    out = subprocess.run([troupe, "advise", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"advise_seeds: troupe advise {' '.join(args)} failed ({out.returncode}): "
                 f"{out.stderr.strip()}")
    return out.stdout


def from_published(e, gpu_floor_ms):
    """A report with only what the seeds' homogeneous run says: its step, on its vCPUs."""
    batch = 256  # any: only augmentation per batch over the step matters
    vcpu_ms_per_batch = e["hom_ms"] * e["dnn_vcpus"]
    return {
        "rates": {
            "augment_images_per_vcpu_second": batch * 1000.0 / vcpu_ms_per_batch,
            "compute_step_ms": gpu_floor_ms,
            "other_ms_per_step": 0.0,
            "trainer_cpu_ms_per_step": 0.0,
            "fill_ms_per_epoch": 0.0,
            "steps_per_epoch": 1000.0,
            "load_ms_per_augmenter": 0.0,
            "epochs": 1,
            "stream_bytes_per_s": 1e12,
            "bytes_per_batch": 1.0,
            "batch_size": batch,
            "trainer_on_cpu": False,
            "augmenters_per_node": 0,
            "dnn_group": "dnn_group",
            "data_group": "data_group",
        },
        "instances": [{"host": "algo-1", "group": "dnn_group", "instance_type": e["dnn"],
                       "vcpus": e["dnn_vcpus"]}],
        "mean_step_ms": float(e["hom_ms"]),
        "data_wait_fraction": 0.0,
        "pricing": "on-demand",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--troupe", default="build/troupe")
    p.add_argument("--report", help="a hetero_train --report of ours (part 2)")
    p.add_argument("--gpu-step-ms", type=float, default=0,
                   help="part 2's what-if: a GPU trainer's compute-only step")
    p.add_argument("--gpu-floor-ms", type=float, default=1.0,
                   help="part 1: the GPU step the seeds do not publish (a floor below every "
                        "prediction: the data side alone decides)")
    a = p.parse_args()
    if not os.access(a.troupe, os.X_OK):
        sys.exit(f"advise_seeds: --troupe {a.troupe} is not an executable; build first (make build)")

    print("| experiment | cluster | published step | advisor, from the homogeneous step "
          "scaled by vCPUs | error | published $/h | advisor $/h | advisor $ per 1,000 steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for e in EXPERIMENTS:
            path = os.path.join(tmp, "report.json")
            with open(path, "w") as f:
                json.dump(from_published(e, a.gpu_floor_ms), f)
            j = json.loads(advise(a.troupe, [path, "--types", e["data"], "--max-count",
                                             str(e["data_count"]), "--json"]))
            for row in j["rows"]:
                n = row["data_count"]
                if n not in (0, e["data_count"]):
                    continue
                published = e["hom_ms"] if n == 0 else e["het_ms"]
                price = e["hom_price"] if n == 0 else e["het_price"]
                cluster = f"1 x {e['dnn']}" + (f" + {n} x {e['data']}" if n else "")
                how = " (the run it starts from)" if n == 0 else ""
                print(f"| {e['name']} | {cluster} | {published} ms | {row['step_ms']:.0f} ms{how} | "
                      f"{100 * (row['step_ms'] / published - 1):+.0f}% | ${price:.3f} | "
                      f"${row['price_per_hour_usd']:.3f} | "
                      f"${row['cost_per_1000_steps_usd']:.3f} |")

    if not a.report:
        return
    for e in EXPERIMENTS:
        base = [a.report, "--dnn-type", e["dnn"], "--types", e["data"], "--max-count",
                str(e["data_count"] + 1)]
        print(f"\n{e['name']} with our measured rates: troupe advise REPORT "
              f"{' '.join(base[1:])}\n\n```")
        print(advise(a.troupe, base).rstrip())
        print("```")
        if a.gpu_step_ms > 0:
            what_if = base + ["--compute-step-ms", str(a.gpu_step_ms)]
            print(f"\nthe same with a GPU trainer (what-if): --compute-step-ms {a.gpu_step_ms:g}"
                  "\n\n```")
            print(advise(a.troupe, what_if).rstrip())
            print("```")


if __name__ == "__main__":
    main()
