#!/usr/bin/env python3
"""Plots a data-group scaling sweep (`bench_pipeline --sweep-data-instances ... --json`).

    scripts/plot_scaling.py SWEEP.json OUT_DIR

writes OUT_DIR/scaling-throughput.svg (training samples/s against data instances, with the
linear line through the one-instance run and the advisor's held-out prediction) and
OUT_DIR/scaling-cost.svg (measured and predicted $ per 1,000 steps against data instances: the
curve whose minimum the advisor picks). Needs matplotlib (Debian: python3-matplotlib). `make
scaling` runs the sweep and this script.
"""

import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: plot_scaling.py SWEEP.json OUT_DIR", file=sys.stderr)
        return 2
    try:
        import matplotlib
    except ImportError:
        print("plot_scaling.py: matplotlib is missing: apt-get install python3-matplotlib "
              "(or pip install matplotlib)", file=sys.stderr)
        return 2
    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    path, out = sys.argv[1], sys.argv[2]
    try:
        with open(path) as f:
            sweep = json.load(f)
        setups = sweep["setups"]
        settings = sweep["settings"]
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_scaling.py: {path}: not a bench_pipeline sweep's --json output ({e})",
              file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    share = settings.get("data_cpu_share", 1)
    blurs = sorted({s["blur"] for s in setups})
    for blur in blurs:
        rows = sorted((s for s in setups if s["blur"] == blur), key=lambda s: s["data_instances"])
        n = [r["data_instances"] for r in rows]
        rate = [r["samples_per_s"] for r in rows]
        predicted = [r["predicted_samples_per_s"] for r in rows]
        one = next((r["samples_per_s"] for r in rows if r["data_instances"] == 1), None)
        suffix = "" if len(blurs) == 1 else f"-blur{blur}"
        title = (f"hetero_train, dnn instance 1 CPU, each data instance {share:g} CPU "
                 f"(troupe sim, 2-core VM)")

        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot(n, rate, "o-", color="#1f77b4", label="measured")
        ax.plot(n, predicted, "s--", color="#ff7f0e",
                label="advisor, held out (from another count's run)")
        if one:
            linear = [k * one for k in n if k >= 1]
            ax.plot([k for k in n if k >= 1], linear, ":", color="#555555",
                    label="linear in data instances (n x the 1-instance run)")
        ax.set_xlabel("data instances (ml.c5.xlarge)")
        ax.set_ylabel("training samples / s")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0, top=max(rate + predicted) * 1.15)
        ax.set_xticks(n)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"scaling-throughput{suffix}.svg"))
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot(n, [r["measured_cost_per_1000_steps_usd"] for r in rows], "o-", color="#1f77b4",
                label="measured step x the instance table's prices")
        ax.plot(n, [r["predicted_cost_per_1000_steps_usd"] for r in rows], "s--",
                color="#ff7f0e", label="advisor, held out")
        ax.set_xlabel("data instances (ml.c5.xlarge)")
        ax.set_ylabel("$ per 1,000 steps (on-demand)")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.set_xticks(n)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"scaling-cost{suffix}.svg"))
        plt.close(fig)
        print(f"plot_scaling.py: wrote {out}/scaling-throughput{suffix}.svg and "
              f"{out}/scaling-cost{suffix}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
