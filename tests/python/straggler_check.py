"""Straggler takeover in order (issue 61): with torch's default in_order=True, one of two data
instances makes every batch far slower than the other (its workers sleep, as a throttled or
saturated instance would). The batch the loop waits for is taken over by the other instance's
workers once it has taken 4 times the median (at least a second), so the slow instance never
holds the loop for long: troupe's log says so, the loop still gets every batch in the sampler's
order, every sample once.

    straggler_check.py --build BUILD

Exits 1 on a failure (its first line says what), 77 without PyTorch.
"""
import os
import re
import sys
import tempfile
import time

import sim_check

SCRIPT = r'''
import os, time
import torch
from troupe.data import DataLoader

SLOW = os.environ.get("STRAGGLER") == "1"  # this instance's workers are the slow ones

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 480
    def __getitem__(self, i):
        time.sleep(0.25 if SLOW else 0.002)
        return torch.tensor([i])

loader = DataLoader(Slow(), batch_size=8, num_workers=2, prefetch_factor=2)
order, started = [], time.monotonic()
for batch in loader:
    order.extend(batch.view(-1).tolist())
print(f"straggler: {len(order)} samples, in order: {order == list(range(480))}, "
      f"{len(set(order))} distinct, {time.monotonic() - started:.1f} s", flush=True)
'''


def main():
    _, build = sim_check.setup()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="straggler-check-") as tmp:
        script = os.path.join(tmp, "straggler.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        # With --seed 5 the hosts are dealt so: algo-3 is a data instance (tests/conformance).
        code, output = sim_check.sim(build, script, sim_check.environment(build), data=2,
                                     options=("--seed", "5", "--env", "algo-3:STRAGGLER=1"))
    print(f"troupe sim exited {code} in {time.monotonic() - started:.1f} s")
    failures = []
    data = re.findall(r"troupe sim: (\S+)\s+data_group", output)
    if "algo-3" not in data:
        failures.append(f"algo-3 is not a data instance here (data instances: {data}): the "
                        "straggler was not where the check puts it")
    result = re.search(r"straggler: (\d+) samples, in order: (\w+), (\d+) distinct, ([\d.]+) s",
                       output)
    takeovers = re.findall(r"shard \d+: '[^']+' on algo-3 has served it for .* takes it over",
                           output)
    if code != 0 or not result:
        failures.append(f"the job failed (exit {code}); its output's end:\n" + output[-3000:])
    else:
        print(f"  {result[0]}; {len(takeovers)} batches taken over from algo-3")
        if result[1] != "480" or result[2] != "True" or result[3] != "480":
            failures.append(f"not every sample once in order: {result[0]}")
        if not takeovers:
            failures.append("no batch was taken over from the slow instance (no 'takes it over' "
                            "line naming algo-3)")
        for line in takeovers[:3]:
            print(f"  {line[:150]}")
    return sim_check.verdict("straggler_check", failures, "the slow instance's batches were "
                             "taken over, in order, every sample once")


if __name__ == "__main__":
    sys.exit(main())
