#!/usr/bin/python3
"""imagenet_soak: an ImageNet-shaped job on troupe.data, soaked (issue 61). A manifest of
--samples samples (default 1,281,167: ImageNet's training set) over --images real JPEGs of
ImageNet's sizes (made here once, 250-500 x 200-400 pixels), ImageNet's training transform on
the data group's C++ pipeline (RandomResizedCrop(224), a flip, ColorJitter, Normalize), a loop
whose step emulates a GPU (--step-ms, a sleep), --data-instances data instances of --workers
augmenters each (default 16 x 8 = 128), --epochs passes (default 3) under `troupe sim`. In the
second pass a data instance is SIGKILLed at a seeded random moment (troupe sim starts its
process again, which rejoins), and one data instance joins late, after the first batches.

It prints, per pass: samples/s, exactly-once counted by the script (with_ids) and by the trainer
(its epoch report), and the peak RSS of each kind of process (the training script's, the largest
data instance's, the largest of their children); then the batches the script may hold (torch's
rule, prefetch_factor x augmenters, or fewer where the trainer's memory bound says so, times a
batch's bytes), the actors the head started and the bytes of their spawn arguments (the job's end
says them), and whether memory was bounded and flat: the script's peak within its RSS at its 20th
batch plus those batches (10% + 64 MiB of slack), the data instances' last pass within 10% + 32
MiB of their first. A table; --json prints
one object. Run it at two --samples to see what memory owes to the sample count (the file list:
each process that opens the manifest holds its paths).

    imagenet_soak.py [--build DIR] [--work DIR] [--samples N] [--images N] [--small-images]
                     [--epochs N] [--data-instances N] [--workers N] [--data-type TYPE]
                     [--batch N] [--step-ms MS] [--transform SPEC] [--seed N] [--no-faults]
                     [--json]

Exits 1 when a pass is not exactly once, a fault was not injected, or memory grew.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET = ("RandomResizedCrop(224),RandomHorizontalFlip(),"
            "ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),Normalize(imagenet)")

SCRIPT = r'''
import json, os, time
import numpy as np
import torch
import troupe.data as td

ds = td.ImageDataset(os.environ["SOAK_MANIFEST"], os.environ["SOAK_TRANSFORM"])
workers = int(os.environ["SOAK_WORKERS"])
loader = td.DataLoader(ds, batch_size=int(os.environ["SOAK_BATCH"]), shuffle=True,
                       num_workers=workers, with_ids=True, seed=int(os.environ["SOAK_SEED"]))
step = int(os.environ["SOAK_STEP_MS"]) / 1000
for epoch in range(int(os.environ["SOAK_EPOCHS"])):
    seen = np.zeros(len(ds), np.uint8)
    started, n, steps, nbytes = time.monotonic(), 0, 0, 0
    for (x, y), ids in loader:
        seen[ids.numpy()] += 1
        n += len(ids)
        steps += 1
        nbytes = max(nbytes, x.numel() * x.element_size())
        if steps == 20:
            print(f"soak: training in epoch {epoch}", flush=True)
        time.sleep(step)
    seconds = time.monotonic() - started
    report = loader.epoch_reports.get(epoch, {})
    print("soak: pass " + json.dumps({
        "epoch": epoch, "samples": n, "seconds": round(seconds, 2), "batch_bytes": nbytes,
        "once": int((seen == 1).sum()), "twice_or_more": int((seen > 1).sum()),
        "missing": int((seen == 0).sum()),
        "trainer": {k: report.get(k) for k in ("samples", "duplicates", "missing", "rejected")},
    }), flush=True)
'''


def make_images(folder, count, seed, small=False):
    """`count` JPEGs of ImageNet's sizes, or 48-96 pixels a side (`small`), made once and kept
    in `folder`."""
    import numpy as np
    from PIL import Image
    os.makedirs(folder, exist_ok=True)
    have = len([n for n in os.listdir(folder) if n.endswith(".jpg")])
    if have >= count:
        return
    rng = np.random.default_rng(seed)
    for i in range(have, count):
        w, h = ((int(rng.integers(64, 97)), int(rng.integers(48, 73))) if small else
                (int(rng.integers(250, 501)), int(rng.integers(200, 401))))
        y, x = np.mgrid[0:h, 0:w]
        a, b, c = rng.integers(1, 9, 3)
        img = np.stack([(x * a + y) % 256, (y * b + 3 * x) % 256, ((x ^ y) * c) % 256], -1)
        img = (img + rng.integers(0, 50, img.shape)).clip(0, 255).astype(np.uint8)
        Image.fromarray(img, "RGB").save(os.path.join(folder, f"{i:05d}.jpg"), quality=85)


def make_manifest(path, images, samples):
    """A CSV of `samples` lines over `images` JPEGs, 1,000 classes (relative paths)."""
    if os.path.exists(path):
        with open(path) as f:
            if sum(1 for _ in f) == samples + 1:
                return
    with open(path, "w") as f:
        f.write("path,label\n")
        for i in range(samples):
            f.write(f"images/{i % images:05d}.jpg,{(i * 7919) % 1000}\n")


def session_members(sid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    out.append((int(name), int(fields[1])))  # (pid, ppid)
            except (OSError, IndexError, ValueError):
                pass
    return out


def rss_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


class Watcher:
    """Every process's RSS every 0.25 s, its peak per pass, each process named by the instance
    it belongs to (the instance pids troupe sim prints)."""

    def __init__(self, sid):
        self.sid = sid
        self.instances = {}   # pid: (host, group)
        self.epoch = 1
        self.peaks = {}       # (pass, host, group, role): peak bytes
        self.baseline = None  # the training script's RSS at its 20th batch of the first pass
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            members = session_members(self.sid)
            parent = dict(members)
            for pid, _ in members:
                rss = rss_of(pid)
                if rss is None:
                    continue
                at, role = pid, "instance"
                while at in parent and at not in self.instances:
                    at, role = parent[at], "child"
                if at not in self.instances:
                    continue  # troupe sim itself
                host, group = self.instances[at]
                key = (self.epoch, host, group, role)
                self.peaks[key] = max(self.peaks.get(key, 0), rss)
            time.sleep(0.25)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "..", "..", "build"))
    ap.add_argument("--work", default=None, help="where the images and manifest are kept")
    ap.add_argument("--samples", type=int, default=1281167)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--small-images", action="store_true",
                    help="JPEGs of 48-96 pixels a side: the sample count's cost, not decoding's")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data-instances", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8,
                    help="augmenters per data instance: at most its type's vCPUs")
    ap.add_argument("--data-type", default="ml.c5.2xlarge", help="the data instances' type")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=2, help="the loader's prefetch_factor")
    ap.add_argument("--step-ms", type=int, default=20)
    ap.add_argument("--transform", default=IMAGENET)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    work = os.path.abspath(args.work or os.path.join(build, "soak"))
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a: print(*a, flush=True))
    d = args.data_instances
    say(f"imagenet_soak: seed {seed}; {args.samples} samples over {args.images} JPEGs"
        f"{' (small)' if args.small_images else ''}, {d} data instances ({args.data_type}) x "
        f"{args.workers} augmenters, {args.epochs} passes, a {args.step_ms} ms step, batches of "
        f"{args.batch}, {args.transform}")
    if args.small_images:
        work = os.path.join(work, "small")
    make_images(os.path.join(work, "images"), args.images, 61, args.small_images)
    manifest = os.path.join(work, f"manifest-{args.samples}.csv")
    make_manifest(manifest, args.images, args.samples)
    script = os.path.join(work, "soak_train.py")
    with open(script, "w") as f:
        f.write(SCRIPT.replace("num_workers=workers,",
                               f"num_workers=workers, prefetch_factor={args.prefetch},"))
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", SOAK_MANIFEST=manifest, SOAK_TRANSFORM=args.transform,
               SOAK_WORKERS=str(args.workers), SOAK_BATCH=str(args.batch),
               SOAK_STEP_MS=str(args.step_ms), SOAK_EPOCHS=str(args.epochs),
               SOAK_SEED=str(seed % 2**31))
    argv = [os.path.join(build, "troupe"), "sim", "--seed", str(seed % 1000),
            "--group", f"data_group={d}:{args.data_type}", "--group",
            "dnn_group=1:ml.p3.2xlarge"]
    if not args.no_faults:
        # One data instance joins after the first batches; the job starts without it.
        argv += ["--start-late", "data_group:1=1000", "--start-late-after",
                 "soak: training in epoch 0",
                 "--env", f"dnn_group:TROUPE_START_WITH=data_group={d - 1}",
                 "--env", f"data_group:TROUPE_START_WITH=data_group={d - 1}"]
    argv += ["--", sys.executable, script]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    watcher = Watcher(proc.pid)
    threading.Thread(target=watcher.run, daemon=True).start()
    lines, passes, faults = [], [], {}

    def kill(delay):
        # The first data instance that is not the late one, SIGKILLed: troupe sim starts its
        # process again (--node-restarts), which rejoins the job.
        late = re.search(r"membership: (\S+) \(data_group\) joined the running job",
                         faults.get("joined", ""))
        data = sorted((h, p) for p, (h, g) in list(watcher.instances.items())
                      if g == "data_group" and not (late and h == late[1]))
        if not data:
            faults["killed"] = "no data instance's pid was printed"
            return
        host, pid = data[0]
        try:
            os.kill(pid, signal.SIGKILL)
            faults["killed"] = f"SIGKILL to {host} (pid {pid}) {delay:.1f} s into the second pass"
        except OSError as e:
            faults["killed"] = f"the kill of {host} (pid {pid}) failed: {e}"

    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"troupe sim: (\S+)\s+(\w+)\s+\S+\s+\S+\s+pid=(\d+)", line)
        if m and int(m[3]) not in watcher.instances:
            watcher.instances[int(m[3])] = (m[1], m[2])
        m = re.search(r"soak: pass (\{.*\})", line)
        if m:
            passes.append(json.loads(m[1]))
            watcher.epoch = len(passes) + 1
            say(f"  pass {len(passes)}: {passes[-1]['samples']} samples in "
                f"{passes[-1]['seconds']} s")
            if len(passes) == 1 and not args.no_faults:
                # A data instance killed at a random moment of the second pass.
                delay = rng.uniform(0.2, 0.6) * passes[0]["seconds"]
                threading.Timer(delay, kill, args=(delay,)).start()
        if "joined the running job" in line:
            faults.setdefault("joined", line.strip()[:160])
        if "soak: training in epoch 0" in line and watcher.baseline is None:
            script = [p for p, (h, g) in list(watcher.instances.items()) if g == "dnn_group"]
            watcher.baseline = rss_of(script[0]) if script else None
    code = proc.wait()
    watcher.done.set()
    output = "".join(lines)
    wall = time.monotonic() - started
    log = os.path.join(work, "soak-output.log")
    with open(log, "w") as f:
        f.write(output)
    say(f"the job's output: {log}")
    m = re.search(r"actors started: (\d+), with (\d+) bytes of spawn arguments", output)
    spawn = {"actors": int(m[1]), "bytes": int(m[2])} if m else None
    # Peaks per pass: the training script's process, the largest data instance's process, the
    # largest child (a restarted instance's process, its fork server).
    rows = []
    for e in range(1, len(passes) + 1):
        mine = {k: v for k, v in watcher.peaks.items() if k[0] == e}
        head = max([v for (_, h, g, r), v in mine.items() if g == "dnn_group" and
                    r == "instance"] or [0])
        data = max([v for (_, h, g, r), v in mine.items() if g == "data_group" and
                    r == "instance"] or [0])
        child = max([v for (_, h, g, r), v in mine.items() if r == "child"] or [0])
        p = passes[e - 1]
        rows.append({"pass": e, "samples_per_s": round(p["samples"] / max(p["seconds"], 1e-9)),
                     "exactly_once": p["once"] == args.samples and p["missing"] == 0 and
                     p["twice_or_more"] == 0 and p["trainer"].get("missing") == 0 and
                     p["trainer"].get("duplicates") == 0,
                     "script_mib": round(head / 2**20), "data_instance_mib": round(data / 2**20),
                     "child_mib": round(child / 2**20)})
    batch_bytes = max([p.get("batch_bytes", 0) for p in passes] or [0])
    rule = args.prefetch * d * args.workers
    m = re.search(r"the trainer holds at most (\d+) of them", output)
    held = min(rule, int(m[1])) if m else rule
    bound_mib = round(held * batch_bytes / 2**20)
    baseline_mib = round((watcher.baseline or 0) / 2**20)
    failures = []
    if code != 0:
        failed = re.findall(r"job failed \([A-Z_]+\): .*", output)
        failures.append(f"the job exited {code}: {failed[0] if failed else output[-2000:]}")
    if len(passes) != args.epochs:
        failures.append(f"{len(passes)} of {args.epochs} passes finished")
    for r in rows:
        if not r["exactly_once"]:
            failures.append(f"pass {r['pass']} was not exactly once: {passes[r['pass'] - 1]}")
    # The training script may hold `held` batches beyond what it holds at its 20th batch; the
    # data instances hold none: theirs must not grow.
    flat = None
    if len(rows) >= 2 and watcher.baseline:
        first, last = rows[0], rows[-1]
        limit = baseline_mib + bound_mib * 1.1 + 64
        over = [r for r in rows if r["script_mib"] > limit]
        grew = last["data_instance_mib"] > first["data_instance_mib"] * 1.1 + 32
        flat = not over and not grew
        if over:
            failures.append(f"the training script grew past its bound ({baseline_mib} MiB at its "
                            f"20th batch + {bound_mib} MiB of batches): {over[0]}")
        if grew:
            failures.append(f"a data instance grew: pass 1 {first}, pass {last['pass']} {last}")
    if not args.no_faults:
        if "killed" not in faults:
            failures.append("no data instance was killed")
        if "joined" not in faults:
            failures.append("no data instance joined late")
    result = {"seed": seed, "samples": args.samples, "images": args.images,
              "small_images": args.small_images, "augmenters": d * args.workers,
              "data_instances": d, "epochs": args.epochs, "step_ms": args.step_ms,
              "batch": args.batch, "transform": args.transform, "passes": rows,
              "batch_bytes": batch_bytes, "held_batches": held, "bound_mib": bound_mib,
              "script_baseline_mib": baseline_mib, "spawn": spawn,
              "faults": faults, "flat": flat, "seconds": round(wall, 1), "ok": not failures}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'pass':>4} {'samples/s':>10} {'exactly once':>13} {'script MiB':>11} "
              f"{'data inst. MiB':>15} {'children MiB':>13}")
        for r in rows:
            print(f"{r['pass']:>4} {r['samples_per_s']:>10} {str(r['exactly_once']):>13} "
                  f"{r['script_mib']:>11} {r['data_instance_mib']:>15} {r['child_mib']:>13}")
        print(f"the training script at its 20th batch: {baseline_mib} MiB; the batches it may "
              f"hold: {held} (prefetch_factor {args.prefetch} x {d * args.workers} augmenters"
              f"{', or its memory bound' if held < rule else ''}) x {batch_bytes / 2**20:.1f} MiB = "
              f"{bound_mib} MiB")
        if spawn:
            print(f"spawn: {spawn['actors']} actors started (restarts too), "
                  f"{spawn['bytes']} bytes of spawn arguments sent from the head")
        for k, v in faults.items():
            print(f"fault: {k}: {v}")
        print(f"memory bounded and flat (the script within its bound every pass, the data "
              f"instances not growing): {flat}; {wall:.0f} s in all")
    for f in failures:
        say("FAILED: " + f.splitlines()[0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
