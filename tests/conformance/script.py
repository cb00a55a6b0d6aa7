"""The conformance suite's small scripts (tests/conformance/run.py judges them): ordinary torch
code, run once with torch's own DataLoader and once with troupe.data's, the only difference the
DataLoader statement. Each case writes what a script can see of its loader to
OUT/<side>.rank<R>.<case>.json: len(), every batch's structure, types, dtypes, shapes and values,
each sample's random draws, the script's own RNG state after each pass, the exception its loop
caught. The runner compares the two sides case by case.

    script.py SIDE OUT CASE[,CASE...]

SIDE is "torch" (torch.utils.data.DataLoader) or "troupe" (troupe.data.DataLoader). Under
torchrun or a troupe DDP job (WORLD_SIZE set before the first line, as torchrun sets it) the
script calls init_process_group() first, as torchrun scripts do. Cases that end the script
(exit_*) must be the run's last. Every dataset is defined before the first DataLoader: a later
loader's dataset reaches the data group pickled.
"""
import collections
import hashlib
import json
import math
import os
import random
import signal
import sys
import time

import numpy
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

SIDE, OUT, CASES = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
DDP = int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("CONFORMANCE_DDP") == "1"
if DDP:
    # torchrun's way: the process group before anything else (troupe sets the environment
    # before the script's first line, as torchrun does).
    dist.init_process_group("gloo")
RANK = dist.get_rank() if DDP else 0
WORLD = dist.get_world_size() if DDP else 1

if SIDE == "troupe":
    import troupe.data
    DataLoader = troupe.data.DataLoader
    if os.environ.get("CONFORMANCE_PLANT") == "1":
        # A planted divergence, which the suite must find (tests/integration/CMakeLists.txt): two
        # of troupe's fixes undone - persistent workers' later epochs seeded as the first, DDP
        # ranks' samples seeded from their own shares.
        import troupe._plan
        import troupe._workers
        troupe._workers.pass_seed = lambda base, passes: base
        troupe._plan.Planner.places = lambda self, label, count: None
else:
    DataLoader = torch.utils.data.DataLoader

Pair = collections.namedtuple("Pair", "first second")
# Seconds each sample takes (the runner's kill shape: a fault lands inside the case).
DELAY = float(os.environ.get("CONFORMANCE_DELAY_MS", "0")) / 1000
FIRST = []  # the run's first batch was printed


class Draws(Dataset):
    """Sample i: i, and its random draws from torch, random and numpy (an augmentation's)."""

    def __init__(self, size=96):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        time.sleep(DELAY)
        return (i, torch.rand(2, dtype=torch.float64), random.random(),
                float(numpy.random.rand()))


class Fixed(Dataset):
    """Sample i: i and values made from it (no randomness)."""

    def __init__(self, size=60):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        time.sleep(DELAY)
        return i, torch.tensor([i, i * 2], dtype=torch.float32)


class Shifted(Fixed):
    """Fixed's samples plus an offset the script changes between epochs (a curriculum, a new
    transform for progressive resizing)."""

    offset = 0

    def __getitem__(self, i):
        index, values = super().__getitem__(i)
        return index, values + self.offset


class Typed(Dataset):
    """Sample i: one of every kind default_collate collates."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {
            "id": i,
            "half": torch.full((2,), i / 7, dtype=torch.float16),
            "bf16": torch.full((3,), i / 3, dtype=torch.bfloat16),
            "flag": torch.tensor(i % 2 == 0),
            "long": torch.tensor([i, -i], dtype=torch.int64),
            "u8": numpy.array([i, 255 - i], dtype=numpy.uint8),
            "f64": float("nan") if i % 5 == 0 else (float("inf") if i % 7 == 0 else i / 4),
            "name": f"sample-{i}",
            "pair": Pair(i, torch.tensor(float(i))),
            "nested": [i, (i + 1, {"deep": torch.tensor([i])})],
            "flags": i % 3 == 0,
        }


class Failing(Dataset):
    """Sample 13 raises KeyError, as a dataset's dict lookup does."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 13:
            raise KeyError(f"no label for sample {i}")
        return i


class Slow(Dataset):
    """The samples `slow` (9) take 4 s each."""

    def __init__(self, slow=(9,)):
        self.slow = slow

    def __len__(self):
        return 24

    def __getitem__(self, i):
        if i in self.slow:
            time.sleep(4)
        return i


class Broken(Dataset):
    """Samples 5 and 17 raise, as a corrupt file does; the rest is i."""

    def __len__(self):
        return 30

    def __getitem__(self, i):
        if i in (5, 17):
            raise OSError(f"image file is truncated: sample {i}")
        return i


class Skipping(Dataset):
    """torch's way to skip bad samples: None for a sample that raises, left out by the collate."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        try:
            return self.inner[i]
        except Exception:  # noqa: BLE001 - what a user's wrapper does
            return None


def skip_none(batch):
    return torch.utils.data.default_collate([b for b in batch if b is not None])


INITIALISED = []


def mark_worker(worker_id):
    INITIALISED.append(worker_id)


class Marked(Dataset):
    """Sample i: i, and whether worker_init_fn ran in the process that made it."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return i, len(INITIALISED) > 0


def pairs(batch):
    """A collate_fn of the script's: a namedtuple of a tensor and a list of strings."""
    return Pair(torch.tensor([b[0] for b in batch]), [f"s{b[0]}" for b in batch])


# -- what the script sees --
def describe(value):
    """A batch as JSON: its structure, each leaf's type, and tensors' dtype, shape and values."""
    if torch.is_tensor(value):
        values = value.float().tolist() if value.dtype == torch.bfloat16 else value.tolist()
        return {"tensor": str(value.dtype), "shape": list(value.shape), "values": _finite(values)}
    if isinstance(value, numpy.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape),
                "values": _finite(value.tolist())}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"namedtuple": type(value).__name__, "items": [describe(v) for v in value]}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [describe(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[k, describe(v)] for k, v in value.items()]}
    return {type(value).__name__: _finite(value)}


def _finite(v):
    """NaN and infinities as strings (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def rng_state():
    """A digest of the script's own generators: torch's, random's and numpy's global ones."""
    h = hashlib.sha256()
    h.update(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    h.update(repr(numpy.random.get_state()[1].tolist()).encode())
    return h.hexdigest()[:16]


def samples_of(batch):
    """A batch of Draws or Fixed as rows, one per sample: [id, values...]."""
    ids = batch[0].tolist()
    rows = []
    for k, i in enumerate(ids):
        row = [i]
        for part in batch[1:]:
            row.append(_finite(part[k].tolist() if torch.is_tensor(part) else part[k]))
        rows.append(row)
    return rows


def observe(loader, epochs=2, rows=True, set_epoch=False, between=None, stop_after=None):
    """What the script sees of `epochs` passes of `loader`."""
    record = {"len": len(loader), "epochs": []}
    for e in range(epochs):
        if set_epoch:
            loader.sampler.set_epoch(e)
        if between is not None:
            between(e)
        batches, samples = [], []
        for step, batch in enumerate(loader):
            batches.append(describe(batch))
            if not FIRST:
                FIRST.append(True)
                print("conformance: first batch", flush=True)
            if rows:
                samples.extend(samples_of(batch))
            if stop_after is not None and step + 1 == stop_after:
                break
        record["epochs"].append({"batches": batches, "samples": samples, "rng": rng_state()})
    return record


def caught(loader):
    """The exception type the script's `try: for batch in loader` catches, and its first line."""
    try:
        for _ in loader:
            pass
    except Exception as e:  # noqa: BLE001 - what the script would catch is the observation
        return {"caught": type(e).__name__, "bases": [c.__name__ for c in type(e).__mro__],
                "first_line": str(e).splitlines()[0] if str(e) else ""}
    return {"caught": None}


def seeded():
    """Every case starts from the same generators (a script's torch.manual_seed(0))."""
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)


# -- the cases: each an ordinary use of the DataLoader --
def case_order():
    """shuffle=False, a short last batch: the epoch's order."""
    return observe(DataLoader(Fixed(), batch_size=8, num_workers=2))


def case_shuffle():
    """shuffle=True after torch.manual_seed(0): torch's permutation each epoch."""
    return observe(DataLoader(Fixed(), batch_size=8, shuffle=True, num_workers=2), epochs=3)


def case_generator():
    """A seeded generator: its permutation, and the global generator untouched."""
    g = torch.Generator().manual_seed(7)
    return observe(DataLoader(Fixed(), batch_size=7, shuffle=True, generator=g, num_workers=2))


def case_drop_last():
    return observe(DataLoader(Fixed(), batch_size=8, shuffle=True, drop_last=True, num_workers=2))


def case_subset_sampler():
    g = torch.Generator().manual_seed(3)
    sampler = torch.utils.data.SubsetRandomSampler(range(0, 60, 3), generator=g)
    return observe(DataLoader(Fixed(), batch_size=4, sampler=sampler, num_workers=2))


def case_weighted_sampler():
    """With replacement: a sample twice in a pass is made twice."""
    weights = torch.arange(1, 61, dtype=torch.float64)
    sampler = torch.utils.data.WeightedRandomSampler(weights, 50, replacement=True)
    return observe(DataLoader(Fixed(), batch_size=10, sampler=sampler, num_workers=2))


def case_batch_sampler():
    batches = [[0, 1, 2], [9], [4, 5, 6, 7, 8], [3, 10, 59]]
    return observe(DataLoader(Fixed(), batch_sampler=batches, num_workers=2))


def case_batch_none():
    """batch_size=None: items one by one, converted (default_convert), not collated."""
    return observe(DataLoader(Fixed(12), batch_size=None, num_workers=1), rows=False)


def case_types():
    """default_collate of every kind: dicts, namedtuples, nested lists, strings, bools, float16,
    bfloat16, numpy arrays, NaN and inf."""
    return observe(DataLoader(Typed(), batch_size=6, num_workers=2), rows=False)


def case_collate_fn():
    """A collate_fn of the script's returning a namedtuple of a tensor and strings."""
    return observe(DataLoader(Fixed(), batch_size=8, collate_fn=pairs, num_workers=2),
                   rows=False)


def case_worker_init_fn():
    return observe(DataLoader(Marked(), batch_size=8, worker_init_fn=mark_worker,
                              num_workers=2))


def case_pinning():
    """pin_memory=True (no CUDA here: torch leaves batches unpinned), pin_memory_device, and an
    explicit multiprocessing_context: the same batches."""
    loader = DataLoader(Fixed(), batch_size=8, num_workers=2, pin_memory=True,
                        pin_memory_device="cuda" if torch.cuda.is_available() else "",
                        multiprocessing_context="fork")
    record = observe(loader, epochs=1)
    record["pinned"] = [bool(b[1].is_pinned()) for b in loader]
    return record


def case_draws():
    """Each sample's random draws, two epochs, two workers: distinct for every (epoch, sample)."""
    return observe(DataLoader(Draws(), batch_size=8, shuffle=True, num_workers=2))


def case_draws0():
    """num_workers=0, a dataset that draws: the same batches and draws in every shape, the first
    epoch's order torch's. (Under torch's num_workers=0 the items draw from the script's
    generators, and the next epochs' shuffles follow; troupe's items draw their per-sample
    numbers and leave the script's generators alone: the workers0 case judges those.)"""
    return observe(DataLoader(Draws(48), batch_size=8, shuffle=True, num_workers=0), epochs=3)


def case_persistent():
    """persistent_workers=True, shuffle=False: the workers' streams go on, epoch 1 draws anew."""
    return observe(DataLoader(Draws(64), batch_size=8, num_workers=2, persistent_workers=True))


def case_prefetch_persistent():
    """Where issue 61's changes meet: a seeded shuffle over many small batches (far more than
    troupe may hold), prefetch_factor=3 (in order, each worker makes 3 of the next batches at
    once), persistent workers; torch's order each epoch, fresh draws in epoch 1."""
    g = torch.Generator().manual_seed(11)
    return observe(DataLoader(Draws(96), batch_size=4, shuffle=True, generator=g, num_workers=2,
                              prefetch_factor=3, persistent_workers=True))


def case_workers0():
    """num_workers=0 (the main process) on a dataset without randomness: the same batches, and
    the script's own generators after each pass as torch leaves them."""
    return observe(DataLoader(Fixed(), batch_size=8, shuffle=True, num_workers=0), epochs=3)


def case_local():
    """local=True (troupe's; torch's DataLoader is always local): the whole dataset on this
    process, every rank; the script's generators as torch leaves them."""
    kwargs = {"local": True} if SIDE == "troupe" else {}
    return observe(DataLoader(Fixed(50), batch_size=10, shuffle=True, num_workers=0, **kwargs))


def case_peek():
    """next(iter(loader)) before the loop, then the epochs."""
    loader = DataLoader(Fixed(), batch_size=8, shuffle=True, num_workers=2)
    first = describe(next(iter(loader)))
    record = observe(loader)
    record["peeked"] = first
    return record


def case_break():
    """A break after 3 batches, then the next epoch whole."""
    loader = DataLoader(Fixed(), batch_size=8, shuffle=True, num_workers=2)
    record = observe(loader, epochs=1, stop_after=3)
    record["after"] = observe(loader, epochs=1)
    return record


def case_dataset_change():
    """The dataset changed between epochs (a curriculum, progressive resizing): each epoch's items
    made from the dataset as it is when its pass starts."""
    dataset = Shifted(40)

    def change(epoch):
        dataset.offset = 1000 * epoch
    return observe(DataLoader(dataset, batch_size=8, num_workers=2), epochs=3, between=change)


def case_many_workers():
    """More workers than batches: idle workers, as torch's."""
    return observe(DataLoader(Fixed(100), batch_size=16, num_workers=64))


def case_exception_type():
    """A KeyError in __getitem__: the script's `except KeyError` around its loop catches it."""
    return caught(DataLoader(Failing(), batch_size=4, num_workers=2))


def case_timeout():
    """timeout=1 and a 4 s sample: RuntimeError."""
    return caught(DataLoader(Slow(), batch_size=4, num_workers=1, timeout=1))


def case_ddp_timeout():
    """DDP: timeout=1, a 4 s sample in each rank's third batch: RuntimeError on each. (The data
    group's workers serve every rank: a rank whose batch waits behind another's slow one waits
    too, where torch's ranks have workers of their own.)"""
    dataset = Slow(slow=(8, 9))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    return caught(DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=2, timeout=1))


def case_skip_errors():
    """Samples that raise left out of their batches: troupe's skip_errors=True, torch's idiom
    (None from the dataset, a collate that drops it)."""
    if SIDE == "troupe":
        loader = DataLoader(Broken(), batch_size=4, num_workers=2, skip_errors=True)
    else:
        loader = DataLoader(Skipping(Broken()), batch_size=4, num_workers=2,
                            collate_fn=skip_none)
    return observe(loader, rows=False)


def image_folder():
    """A small ImageFolder of JPEGs of many sizes, two of them corrupt, made once in OUT (every
    instance's script sees it whole: it appears by a rename)."""
    root = os.path.join(OUT, "images")
    if not os.path.isdir(root):
        from PIL import Image
        made = f"{root}.{os.getpid()}"
        for k in range(40):
            folder = os.path.join(made, f"class{k % 3}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{k:02}.jpg")
            if k in (7, 23):
                with open(path, "wb") as f:
                    f.write(b"\xff\xd8\xff\xe0 not a JPEG")
                continue
            Image.new("RGB", (20 + k, 16 + k % 5), (k * 6, 255 - k * 6, k * 3)).save(path)
        try:
            os.rename(made, root)
        except OSError:  # another instance's came first
            import shutil
            shutil.rmtree(made, ignore_errors=True)
    return root


def case_translated_skip():
    """torchvision's ImageFolder with a Compose troupe translates to its C++ pipeline, two corrupt
    JPEGs: skip_errors=True leaves them out (torch's side: the idiom, None and a collate)."""
    import torchvision
    import torchvision.transforms as T
    dataset = torchvision.datasets.ImageFolder(image_folder(), transform=T.Compose([
        T.RandomResizedCrop(16), T.ToTensor()]))
    if SIDE == "troupe":
        loader = DataLoader(dataset, batch_size=8, num_workers=2, skip_errors=True)
    else:
        loader = DataLoader(Skipping(dataset), batch_size=8, num_workers=2, collate_fn=skip_none)
    return observe(loader, rows=False)


def case_ddp_sampler():
    """DDP, a DistributedSampler in the DataLoader (the script unchanged but the statement)."""
    sampler = torch.utils.data.distributed.DistributedSampler(Draws(), shuffle=True, seed=5)
    return observe(DataLoader(Draws(), batch_size=8, sampler=sampler, num_workers=2),
                   set_epoch=True)


def case_ddp_persistent():
    """DDP x persistent workers (x a data instance killed, in that shape): each rank's batches as
    torch's, every epoch drawing anew on every rank."""
    sampler = torch.utils.data.distributed.DistributedSampler(Draws(64), shuffle=True, seed=2)
    return observe(DataLoader(Draws(64), batch_size=8, sampler=sampler, num_workers=2,
                              persistent_workers=True), set_epoch=True)


def case_ddp_shared():
    """DDP, the docs' one-statement change: troupe shares each pass among the ranks itself (no
    sampler), torch's side has a DistributedSampler (seed 0, its default)."""
    if SIDE == "troupe":
        loader = DataLoader(Draws(), batch_size=8, shuffle=True, num_workers=2)
    else:
        sampler = torch.utils.data.distributed.DistributedSampler(Draws(), shuffle=True)
        loader = DataLoader(Draws(), batch_size=8, sampler=sampler, num_workers=2)
    return observe(loader, set_epoch=True)


def case_ddp_rank0_peek():
    """DDP: rank 0 alone looks at a batch (to log it), then every rank trains an epoch with an
    all_reduce per step."""
    sampler = torch.utils.data.distributed.DistributedSampler(Fixed(64), shuffle=False)
    loader = DataLoader(Fixed(64), batch_size=8, sampler=sampler, num_workers=1)
    if RANK == 0:
        next(iter(loader))
    record = {"epochs": []}
    for _ in range(2):
        steps = 0
        for _ in loader:
            t = torch.ones(1)
            dist.all_reduce(t)
            steps += 1
        record["epochs"].append({"steps": steps})
    return record


def case_exit_ok():
    for _ in DataLoader(Fixed(), batch_size=8, num_workers=1):
        pass
    return {"ended": "normally"}


def case_exit_code():
    """sys.exit(4) at step 5 (a NaN-loss check)."""
    for step, _ in enumerate(DataLoader(Fixed(), batch_size=4, num_workers=1)):
        if step == 5:
            write("exit_code", {"exited": 4})
            sys.exit(4)
    return {"exited": None}


def case_exit_exception():
    for step, _ in enumerate(DataLoader(Fixed(), batch_size=4, num_workers=1)):
        if step == 5:
            write("exit_exception", {"raised": "ValueError"})
            raise ValueError("loss is NaN at step 5")
    return {"raised": None}


def case_exit_signal():
    """The script's process killed by a signal (the OOM killer's SIGKILL)."""
    for step, _ in enumerate(DataLoader(Fixed(), batch_size=4, num_workers=1)):
        if step == 5:
            write("exit_signal", {"signal": "SIGKILL"})
            os.kill(os.getpid(), signal.SIGKILL)
    return {"signal": None}


def write(case, record):
    record["side"] = SIDE
    record["rank"] = RANK
    record["world"] = WORLD
    record["torch"] = torch.__version__
    path = os.path.join(OUT, f"{SIDE}.rank{RANK}.{case}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


for name in CASES:
    seeded()
    write(name, globals()["case_" + name]())
    print(f"conformance: {SIDE} rank {RANK}: {name} done", flush=True)
if DDP:
    dist.barrier()
    dist.destroy_process_group()
