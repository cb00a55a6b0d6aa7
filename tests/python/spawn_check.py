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
import os
import re
import sys
import tempfile

import sim_check

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
    _, build = sim_check.setup()
    peak, head = {"rss": 0}, {}

    def on_line(line, proc):
        # The head (the training instance's process) from troupe sim's table of pids; its peak
        # RSS (VmHWM) read at every line after.
        m = re.search(r"troupe sim: \S+\s+dnn_group\s+\S+\s+\S+\s+pid=(\d+)", line)
        if m:
            head["pid"] = int(m[1])
        if "pid" in head:
            try:
                with open(f"/proc/{head['pid']}/status") as f:
                    hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))
                peak["rss"] = max(peak["rss"], hwm * 1024)
            except (OSError, StopIteration):
                pass
    with tempfile.TemporaryDirectory(prefix="spawn-check-") as tmp:
        script = os.path.join(tmp, "spawn.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        code, output = sim_check.sim(build, script, sim_check.environment(build), data=2,
                                     on_line=on_line)
    sent = re.findall(r"DataLoader 1: its workers' spec \(([\d.]+) MiB\) sent", output)
    result = re.search(r"spawn: later loader (\d+) samples, every one once: (\w+)", output)
    print(f"troupe sim exited {code}; the spec ({sent[0] if sent else '?'} MiB) sent "
          f"{len(sent)} times; the head's peak RSS {peak['rss'] / 2**20:.0f} MiB")
    failures = []
    if code != 0 or not result:
        failures.append(f"the job failed (exit {code}); its output's end:\n" + output[-3000:])
    elif result[2] != "True":
        failures.append(f"not every sample once: {result[0]}")
    if len(sent) > 2 or not sent:
        failures.append(f"the spec was sent {len(sent)} times for 2 data instances (16 "
                        "augmenters): once per data instance's process")
    return sim_check.verdict("spawn_check", failures,
                             "a later loader's spec left the head once per data instance")


if __name__ == "__main__":
    sys.exit(main())
