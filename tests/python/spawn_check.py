"""The spawn path O(nodes) (issue 61): a DataLoader made after the first ships its workers' spec -
the script's Dataset, pickled - to the data instances. It rides in no augmenter's spawn
arguments: each data instance's process fetches it from the trainer once, whatever the number of
its augmenters. A 16 MiB dataset, 8 workers on each of 2 data instances (16 augmenters), under
`troupe sim`: the log must say the spec was sent twice (once per data instance), the loader must
give every sample once, and the head's RSS must not grow by the 16 copies (256 MiB) the spawn
arguments held before.

    spawn_check.py --build BUILD

Exits 1 on a failure (its first line says what), 77 without PyTorch.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SCRIPT = r'''
import os
import torch
from troupe.data import DataLoader

class Heavy(torch.utils.data.Dataset):
    """16 MiB of state pickled with it (a table, a vocabulary)."""
    def __init__(self):
        self.table = os.urandom(16 << 20)
    def __len__(self):
        return 256
    def __getitem__(self, i):
        return torch.tensor([i, self.table[i]])

first = DataLoader(list(range(8)), batch_size=4, num_workers=1)
print("spawn: first loader", sum(len(b) for b in first), flush=True)
heavy = Heavy()
seen = [int(b[0]) for batch in DataLoader(heavy, batch_size=16, num_workers=8) for b in batch]
ok = sorted(seen) == list(range(256))
print(f"spawn: later loader {len(seen)} samples, every one once: {ok}", flush=True)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipping: PyTorch is not installed for this python3 (python3-torch)")
        return 77
    build = os.path.abspath(args.build)
    peak = {"head": 0}
    with tempfile.TemporaryDirectory(prefix="spawn-check-") as tmp:
        script = os.path.join(tmp, "spawn.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS="1")
        argv = [os.path.join(build, "troupe"), "sim", "--group", "data_group=2:ml.c5.xlarge",
                "--group", "dnn_group=1:ml.p3.2xlarge", "--", sys.executable, script]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True, errors="replace")
        lines, done = [], threading.Event()

        def read():
            for line in proc.stdout:
                lines.append(line)

        def watch():
            # The head (the training instance's process) from troupe sim's table of pids.
            while not done.is_set():
                m = re.search(r"troupe sim: \S+\s+dnn_group\s+\S+\s+\S+\s+pid=(\d+)",
                              "".join(lines[:40]))
                if m:
                    try:
                        with open(f"/proc/{m[1]}/status") as f:
                            rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
                        peak["head"] = max(peak["head"], rss * 1024)
                    except (OSError, StopIteration):
                        pass
                time.sleep(0.1)
        threads = [threading.Thread(target=read, daemon=True),
                   threading.Thread(target=watch, daemon=True)]
        for t in threads:
            t.start()
        try:
            code = proc.wait(400)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        done.set()
        threads[0].join(10)
    output = "".join(lines)
    sent = re.findall(r"DataLoader 1: its workers' spec \(([\d.]+) MiB\) sent", output)
    result = re.search(r"spawn: later loader (\d+) samples, every one once: (\w+)", output)
    print(f"troupe sim exited {code}; the spec ({sent[0] if sent else '?'} MiB) sent "
          f"{len(sent)} times; the head's peak RSS {peak['head'] / 2**20:.0f} MiB")
    failures = []
    if code != 0 or not result:
        failures.append(f"the job failed (exit {code}); its output's end:\n" + output[-3000:])
    elif result[2] != "True":
        failures.append(f"not every sample once: {result[0]}")
    if len(sent) > 2 or not sent:
        failures.append(f"the spec was sent {len(sent)} times for 2 data instances (16 "
                        "augmenters): once per data instance's process")
    if failures:
        print("FAILED: " + failures[0].splitlines()[0])
        for f in failures:
            print(f)
        return 1
    print("spawn_check: a later loader's spec left the head once per data instance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
