"""troupe.data.DataLoader under test (tests/integration/pytorch_test.cpp): a map-style Dataset
whose samples carry their own index, so the script counts every sample itself.

    dataloader_check.py MODE [SAMPLES]

MODE: plain (3 epochs, every sample once, whole batches but the last, the batches' digest and the
digest of their sequence), order (the same with in_order=True), skip (dataset[123] and dataset[500]
raise, skip_errors=True: the trainer's epoch reports), slow (the same, 2 ms a sample, 2 workers an
instance: a fault the test injects lands inside an epoch), break (epoch 0 left after 3 batches,
epoch 1 whole, epoch 0's report counting the rest abandoned), fail (dataset[123] raises), types
(bad arguments, each a Python error naming it). Prints `check: ...` lines; exits 1 on a failed
check.
"""
import hashlib
import signal
import sys
import time

import torch
import troupe.data

MODE = sys.argv[1]
SAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
BATCH = 64


class Indexed(torch.utils.data.Dataset):
    """Sample i: a (3, 4, 4) float tensor of i, its label i % 10, and a dict beside it."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        if MODE == "fail" and i == 123:
            raise ValueError("sample 123 is bad on purpose")
        if MODE == "skip" and i in (123, 500):
            raise ValueError(f"sample {i} is bad on purpose")
        if MODE == "slow":
            time.sleep(0.002)
        return torch.full((3, 4, 4), float(i)), i % 10, {"id": i}


def fail(text):
    print(f"check: FAILED {text}", flush=True)
    sys.exit(1)


if MODE == "types":
    for kwargs, needle in (({"batch_size": 2.0}, "batch_size=2.0: an int"),
                           ({"batch_size": 0}, "batch_size=0: at least 1"),
                           ({"skip_errors": "yes"}, "skip_errors='yes': True or False"),
                           ({"collate_fn": 3}, "collate_fn=3 is not callable"),
                           ({"worker_init_fn": 3}, "worker_init_fn=3 is not callable"),
                           ({"prefetch": 2}, "unknown argument(s) prefetch")):
        try:
            troupe.data.DataLoader(Indexed(), **kwargs)
            fail(f"{kwargs} was accepted")
        except (TypeError, ValueError) as e:
            if needle not in str(e):
                fail(f"{kwargs}: {e!r} does not say '{needle}'")
            print(f"check: {kwargs} -> {type(e).__name__}: {e}", flush=True)
    # AugmentedBatches' options reach the native module, which names a value of the wrong type.
    for kwargs, needle in (({"blur": "x"}, "blur='x': an int"),
                           ({"restarts": -1}, "restarts=-1: an int, 0 or more"),
                           ({"augment": "medium"}, "augment='medium': use 'heavy' or 'light'")):
        try:
            troupe.data.AugmentedBatches(**kwargs)
            fail(f"AugmentedBatches {kwargs} was accepted")
        except (TypeError, ValueError) as e:
            if needle not in str(e):
                fail(f"AugmentedBatches {kwargs}: {e!r} does not say '{needle}'")
            print(f"check: AugmentedBatches {kwargs} -> {type(e).__name__}: {e}", flush=True)
    print("check: types ok", flush=True)
    sys.exit(0)

loader = troupe.data.DataLoader(Indexed(), batch_size=BATCH, shuffle=True, seed=7, with_ids=True,
                                skip_errors=MODE == "skip", in_order=MODE == "order",
                                num_workers=2 if MODE == "slow" else None)
print(f"check: len {len(loader)}", flush=True)
epochs = 3
for epoch in range(epochs):
    counts = {}
    sizes = []
    batches = []
    source = iter(loader)
    if epoch == 0:
        first = source  # kept: used again after a newer iter() it must raise
    for k, (batch, ids) in enumerate(source):
        (x, y, extra) = batch
        if not torch.equal(x[:, 0, 0, 0].long(), ids) or not torch.equal(y, ids % 10):
            fail(f"epoch {epoch}: a batch's tensors are not its samples'")
        if not torch.equal(extra["id"], ids):
            fail(f"epoch {epoch}: the dict beside the tensors is not the samples'")
        for i in ids.tolist():
            counts[i] = counts.get(i, 0) + 1
        sizes.append(len(ids))
        batches.append(tuple(sorted(ids.tolist())))
        if k == 5:
            print(f"check: epoch {epoch} past batch 5", flush=True)
        if MODE == "break" and epoch == 0 and k == 2:
            break
    if MODE == "break" and epoch == 0:
        print(f"check: epoch 0 left after {len(sizes)} batches", flush=True)
        continue
    once = sum(1 for v in counts.values() if v == 1)
    whole = all(s == BATCH for s in sizes if s != SAMPLES % BATCH) and \
        sizes.count(SAMPLES % BATCH) <= 1
    digest = hashlib.sha256(repr(sorted(batches)).encode()).hexdigest()[:16]
    sequence = hashlib.sha256(repr(batches).encode()).hexdigest()[:16]
    print(f"check: epoch {epoch}: {sum(counts.values())} samples, {once} once, "
          f"{len(set(range(SAMPLES)) - set(counts))} missing, {len(sizes)} batches, "
          f"whole {whole}, batches {digest}, sequence {sequence}", flush=True)
    if MODE == "break" and epoch == 1:
        r = loader.epoch_reports.get(0, {})
        print(f"check: epoch 0 report: {r.get('samples')} samples, {r.get('abandoned')} "
              f"abandoned, {r.get('missing')} missing", flush=True)
        try:
            next(first)
            fail("the iterator of epoch 0 gave a batch after epoch 1's")
        except RuntimeError as e:
            print(f"check: epoch 0's iterator after epoch 1: RuntimeError: {e}", flush=True)
    if MODE == "skip":
        r = loader.epoch_reports.get(epoch, {})
        print(f"check: epoch {epoch} report: {r.get('samples')} samples, {r.get('missing')} "
              f"missing, {r.get('skipped')} skipped: {'; '.join(r.get('skipped_files', []))}",
              flush=True)
print("check: done", flush=True)
