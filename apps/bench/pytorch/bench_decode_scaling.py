#!/usr/bin/python3
"""bench_decode_scaling: what DCT-scaled decoding buys and costs a translated torchvision Compose
(troupe.data.DataLoader(decode_scaling=True), docs/pytorch.md), in the same run: the drop-in
example (examples/pytorch/train_images.py: a small CNN, RandomResizedCrop(32, scale=(0.5, 1.0)),
a flip, ColorJitter, Normalize) on an ImageFolder of JPEGs large enough for the scaling to apply
(make_images: Fashion-MNIST enlarged to 96-192 pixels a side, so a crop's box of 68 pixels or more
is decoded at 1/2 or less), under `troupe sim` with 2 data instances and 1 training instance, the
same seed, once with JPEGs at full size (torchvision's pixels, the default) and once DCT-scaled.

Per setting: the data group's pace (steps/s and the loop's data wait, as the example prints
them), and the test accuracy after each epoch (the test set decoded by torchvision in the
script, the same for both). Then the pixel difference: the same training JPEGs through the
translated spec with and without scaling (troupe._native.Transform, a Resize to 32 that the
scaling applies to), the largest and the mean difference in levels of 255.

    bench_decode_scaling.py [--build DIR] [--epochs N] [--samples N] [--rounds N] [--json]

Exits 1 when a run fails.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def run(build, data, epochs, scaling):
    with open(os.path.join(REPO, "examples", "pytorch", "train_images.py")) as f:
        text = f.read()
    call = "troupe.data.DataLoader(train, args.batch_size, shuffle=True, num_workers=4)"
    assert call in text, "the example's DataLoader line changed: update this bench"
    text = text.replace(call, call[:-1] + f", decode_scaling={scaling})")
    with tempfile.TemporaryDirectory(prefix="bench-decode-scaling-") as tmp:
        script = os.path.join(tmp, "train_images.py")
        with open(script, "w") as f:
            f.write(text)
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS="1")
        argv = [os.path.join(build, "troupe"), "sim", "--seed", "7",
                "--group", "data_group=2:ml.c5.xlarge", "--group", "dnn_group=1:ml.p3.2xlarge",
                "--", sys.executable, script, data, "--epochs", str(epochs)]
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=1800)
    epochs_seen = [dict(steps_per_s=float(m[1]), wait=int(m[2]), accuracy=float(m[3]))
                   for m in re.finditer(r"epoch \d+/\d+: .* ([\d.]+) steps/s, data wait (\d+)%, "
                                        r"test accuracy ([\d.]+)", proc.stdout)]
    said = re.search(r"troupe\.data: DataLoader 0: (.*)", proc.stdout)
    return proc.returncode, epochs_seen, (said[1] if said else ""), proc.stdout


def pixels(build, train, count):
    """The largest and mean difference, in levels of 255, between a DCT-scaled decode and a full
    one of the same JPEGs through Resize(32): what the scaling changes."""
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np
    from troupe import _native
    full, scaled = _native.Transform("Resize((32, 32))"), _native.Transform("Resize((32, 32))")
    full.decode_scaling = False
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(train) for f in fs
                   if f.endswith(".jpg"))[:count]
    worst, total, n = 0, 0.0, 0
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        a = np.asarray(full(data, 0, path)).astype(int)
        b = np.asarray(scaled(data, 0, path)).astype(int)
        d = np.abs(a - b)
        worst, total, n = max(worst, int(d.max())), total + float(d.mean()), n + 1
    return worst, total / max(n, 1), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    data = os.path.join(build, f"decode-scaling-data-{args.samples}")
    if not os.path.isdir(os.path.join(data, "train")):
        subprocess.run([os.path.join(build, "apps", "hetero_train", "make_images"), data,
                        "--samples", str(args.samples), "--test-samples", "1000",
                        "--min-size", "96", "--max-size", "192", "--png-every", "0",
                        "--grey-every", "0"], check=True, stdout=subprocess.DEVNULL)
    results, failures = {}, []
    for scaling in (False, True):
        code, epochs, said, output = run(build, data, args.epochs, scaling)
        results["scaled" if scaling else "full"] = {"epochs": epochs, "line": said}
        if code != 0 or len(epochs) != args.epochs:
            failures.append(f"decode_scaling={scaling}: exit {code}, {len(epochs)} epochs: "
                            f"{output[-1500:]}")
    worst, mean, n = pixels(build, os.path.join(data, "train"), 300)
    results["pixels"] = {"max_levels": worst, "mean_levels": round(mean, 3), "files": n}
    if args.json:
        print(json.dumps(results))
    else:
        print(f"{'decode':<22} " + " ".join(f"{'epoch ' + str(e + 1):>22}"
                                            for e in range(args.epochs)))
        for key, label in (("full", "full size (default)"), ("scaled", "DCT-scaled")):
            cells = [f"{e['steps_per_s']:5.1f} st/s {e['wait']:3d}% {e['accuracy']:.4f}"
                     for e in results[key]["epochs"]]
            print(f"{label:<22} " + " ".join(f"{c:>22}" for c in cells))
        print("(each epoch: steps/s, the loop's data wait, test accuracy)")
        print(f"pixels, Resize((32, 32)) of {n} training JPEGs, DCT-scaled against full: max "
              f"{worst} levels of 255, mean {mean:.3f}")
    for f in failures:
        print("FAILED: " + f.splitlines()[0], file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
