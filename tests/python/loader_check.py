"""troupe.data.DataLoader as torch's DataLoader, under test (tests/integration/
pytorch_loader_test.cpp): its workers, its randomness, torch's arguments, several loaders, the
passes' reports. Each mode prints `check: ...` lines the test reads; a failed check prints
`check: FAILED ...` and exits 1.

    loader_check.py MODE [ARG]

parallel W   items that sleep 40 ms, num_workers=W: per instance, the pids that made items and the
             most items that ran at once (intervals measured in the workers)
random S     each item's draws of torch, random and numpy, and get_worker_info(); seed=S ("none":
             no seed, "global": torch.manual_seed(0) only); a digest of every item's draws by
             its index, per pass; and whether the batches are torch's DataLoader's
args        torch's arguments: samplers, a batch sampler, generator, worker_init_fn,
             prefetch_factor, persistent_workers, batch_size=None, pin_memory, timeout, and the
             ones troupe cannot honour
loaders      a training loader, a validation loader on the data group and a test loader on this
             instance, each with its own reports
peek         next(iter(loader)) before the loop; set_epoch(5) on a second loader
badfile DIR  torchvision's ImageFolder over DIR with a corrupt JPEG, in Python workers
             (translate=False): the job fails naming it
lying        a data worker that lies about one tensor's shape in each batch it makes (a malformed
             tensor on the wire): the job fails naming it; no array is made past its bytes
images DIR   troupe.data.ImageDataset over the ImageFolder DIR, through a DataLoader (on the data
             group: troupe's C++ pipeline): a digest of each sample's pixels per epoch, with the
             dataset's own seed and with the loader's per-sample seeds
translated DIR
             torchvision's ImageFolder over DIR with a Compose troupe translates (its batches from
             the data group's C++ pipeline): every sample once an epoch with torchvision's
             targets; a deterministic Compose's tensors equal torchvision's own, computed here;
             translate=False and an untranslatable Compose stay in Python workers
"""
import collections
import hashlib
import json
import os
import random
import sys
import time

import numpy
import torch
import troupe.data

MODE = sys.argv[1]
ARG = sys.argv[2] if len(sys.argv) > 2 else ""


def fail(text):
    print(f"check: FAILED {text}", flush=True)
    sys.exit(1)


def host():
    """This process's instance (troupe sim and SageMaker write it in resourceconfig.json)."""
    root = os.environ.get("TROUPE_SM_ROOT")
    if not root:
        return "local"
    with open(os.path.join(root, "input/config/resourceconfig.json")) as f:
        return json.load(f)["current_host"]


HOST = host()  # (the fork server and the workers are forks of this process: the same host)


class Sleepy(torch.utils.data.Dataset):
    """Item i sleeps 40 ms; says its index, pid and when it ran (microseconds), and its host."""

    def __len__(self):
        return 240

    def __getitem__(self, i):
        start = time.monotonic_ns() // 1000
        time.sleep(0.04)
        return torch.tensor([i, os.getpid(), start, time.monotonic_ns() // 1000]), HOST


class Draws(torch.utils.data.Dataset):
    """Item i: its index, torch's, random's and numpy's draws, get_worker_info() and its host."""

    def __init__(self, size=320):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        worker = [info.id, info.num_workers, info.seed % 2**62] if info is not None else [-1, 0, 0]
        draws = torch.cat([torch.rand(2, dtype=torch.float64),
                           torch.tensor([random.random(), float(numpy.random.rand())],
                                        dtype=torch.float64)])
        return i, draws, torch.tensor(worker), HOST, os.getpid()


INIT = []  # worker_init_fn's calls in this worker: (worker id, its seed)


def init_worker(worker_id):
    INIT.append((worker_id, torch.utils.data.get_worker_info().seed % 2**62))


class Marked(torch.utils.data.Dataset):
    """Item i: i, and what worker_init_fn recorded in the worker that made it."""

    def __init__(self, size=1000, slow=None):
        self.size = size
        self.slow = slow

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if self.slow is not None and i == self.slow:
            time.sleep(5)
        last = INIT[-1] if INIT else (-1, -1)
        return i, len(INIT), last[1]


def parallel():
    workers = int(ARG or 2)
    loader = troupe.data.DataLoader(Sleepy(), batch_size=4, shuffle=True, num_workers=workers)
    for epoch in range(2):
        spans = collections.defaultdict(list)
        pids = collections.defaultdict(set)
        seen = collections.Counter()
        for x, hosts in loader:
            for (i, pid, start, end), h in zip(x.tolist(), hosts):
                seen[i] += 1
                pids[h].add(pid)
                spans[h].append((start, end))
        for h in sorted(spans):
            events = sorted([(s, 1) for s, _ in spans[h]] + [(e, -1) for _, e in spans[h]])
            now = most = 0
            for _, step in events:
                now += step
                most = max(most, now)
            print(f"check: epoch {epoch}: instance {h}: {len(spans[h])} items from "
                  f"{len(pids[h])} worker processes, at most {most} at once", flush=True)
        print(f"check: epoch {epoch}: {sum(seen.values())} samples, {len(seen)} distinct",
              flush=True)


def draws_digest(by_index):
    return hashlib.sha256(repr(sorted(by_index.items())).encode()).hexdigest()[:16]


def random_mode():
    seed = None if ARG in ("none", "global", "") else int(ARG)
    if ARG == "global":
        torch.manual_seed(0)
    kwargs = dict(batch_size=8, shuffle=True, num_workers=2, in_order=True)
    # torch's own DataLoader, the same arguments and generator state: its batches are the truth
    # (over the indices themselves: Draws' items would draw from this process's generator).
    state = torch.get_rng_state()
    reference = torch.utils.data.DataLoader(
        list(range(len(Draws()))), batch_size=8, shuffle=True,
        generator=None if seed is None else torch.Generator().manual_seed(seed))
    torch_batches = [[batch.tolist() for batch in reference] for _ in range(2)]
    torch.set_rng_state(state)
    if seed is not None:
        kwargs["seed"] = seed
    loader = troupe.data.DataLoader(Draws(), **kwargs)
    for epoch in range(2):
        by_index, batches = {}, []
        workers = collections.defaultdict(set)
        bases = collections.defaultdict(set)
        for ids, draws, worker, hosts, pids in loader:
            batches.append(ids.tolist())
            for i, d, w, h in zip(ids.tolist(), draws.tolist(), worker.tolist(), hosts):
                by_index[i] = tuple(round(v, 12) for v in d)
                workers[h].add((w[0], w[1]))
                bases[h].add((w[2] - w[0]) % 2**62)
        values = [v for d in by_index.values() for v in d[:2]]
        print(f"check: epoch {epoch}: {len(by_index)} items, torch draws distinct "
              f"{len(set(values))} of {len(values)}, digest {draws_digest(by_index)}", flush=True)
        for h in sorted(workers):
            ids = sorted(w[0] for w in workers[h])
            print(f"check: epoch {epoch}: instance {h}: get_worker_info ids {ids} of "
                  f"{sorted(set(w[1] for w in workers[h]))}, base seeds {len(bases[h])}",
                  flush=True)
        every = [b for h in bases for b in bases[h]]
        print(f"check: epoch {epoch}: instances {len(bases)}, their base seeds distinct "
              f"{len(set(every)) == len(every)}", flush=True)
        print(f"check: epoch {epoch}: torch's batches {batches == torch_batches[epoch]}",
              flush=True)


def args_mode():
    g = torch.Generator().manual_seed(3)
    cases = []
    # A sampler: SubsetRandomSampler of the even indices.
    even = troupe.data.DataLoader(Marked(), batch_size=10, num_workers=2,
                                  sampler=torch.utils.data.SubsetRandomSampler(range(0, 1000, 2),
                                                                               generator=g))
    cases.append(("subset", even, 500))
    # With replacement: samples drawn again are made again (positions, not ids, are counted).
    weights = torch.ones(1000)
    weighted = troupe.data.DataLoader(
        Marked(), batch_size=50, num_workers=2,
        sampler=torch.utils.data.WeightedRandomSampler(weights, 600, replacement=True,
                                                       generator=torch.Generator().manual_seed(4)))
    cases.append(("weighted", weighted, 600))
    # A batch sampler of batches of 7.
    sevens = troupe.data.DataLoader(
        Marked(), num_workers=2, batch_sampler=torch.utils.data.BatchSampler(
            torch.utils.data.SequentialSampler(range(1000)), 7, drop_last=False))
    cases.append(("batch_sampler", sevens, 1000))
    # worker_init_fn, prefetch_factor and persistent workers.
    inited = troupe.data.DataLoader(Marked(), batch_size=20, num_workers=2, prefetch_factor=4,
                                    worker_init_fn=init_worker, persistent_workers=True,
                                    multiprocessing_context="fork")
    cases.append(("worker_init_fn", inited, 1000))
    fresh = troupe.data.DataLoader(Marked(), batch_size=20, num_workers=2,
                                   worker_init_fn=init_worker)
    cases.append(("not_persistent", fresh, 1000))
    single = troupe.data.DataLoader(Marked(100), batch_size=None, num_workers=1)
    cases.append(("batch_size_none", single, 100))
    for epoch in range(2):
        for name, loader, expected in cases:
            sizes, ids, inits, seeds = [], [], set(), set()
            for batch in loader:
                i, count, seed = batch
                if name == "batch_size_none":
                    if not isinstance(i, int) and i.dim() != 0:
                        fail(f"batch_size=None gave a batch of shape {tuple(i.shape)}")
                    i, count, seed = [int(i)], [int(count)], [int(seed)]
                else:
                    i, count, seed = i.tolist(), count.tolist(), seed.tolist()
                sizes.append(len(i))
                ids.extend(i)
                inits.update(count)
                seeds.update(seed)
            report = loader.epoch_reports.get(epoch, {})
            print(f"check: epoch {epoch}: {name}: {len(ids)} items of {expected}, "
                  f"{len(set(ids))} distinct, even {all(i % 2 == 0 for i in ids)}, sizes "
                  f"{sorted(set(sizes))}, init calls {sorted(inits)}, worker seeds "
                  f"{len(seeds)}, report samples {report.get('samples')} duplicates "
                  f"{report.get('duplicates')} missing {report.get('missing')}", flush=True)
    # torch's own checks, with torch's messages.
    for kwargs, needle in (({"batch_size": 4, "batch_sampler": [[0, 1]]}, "batch_sampler option"),
                           ({"sampler": [0, 1], "shuffle": True}, "sampler option"),
                           ({"seed": 1, "generator": g}, "seed= and generator= both given"),
                           ({"multiprocessing_context": "bogus"}, "valid start method"),
                           ({"prefetch": 4}, "unknown argument(s) prefetch")):
        try:
            troupe.data.DataLoader(Marked(), **kwargs)
            fail(f"{kwargs} was accepted")
        except (TypeError, ValueError) as e:
            if needle not in str(e):
                fail(f"{kwargs}: {e!r} does not say '{needle}'")
            print(f"check: refused {sorted(kwargs)}: {type(e).__name__}: {e}", flush=True)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    try:
        troupe.data.DataLoader(Stream(), batch_size=2)
        fail("an IterableDataset was accepted on the data group")
    except TypeError as e:
        if "local=True" not in str(e):
            fail(f"the IterableDataset's TypeError names no alternative: {e}")
        print(f"check: IterableDataset: TypeError: {e}", flush=True)
    local = [b.tolist() for b in troupe.data.DataLoader(Stream(), batch_size=5, local=True)]
    print(f"check: IterableDataset with local=True: {local}", flush=True)
    troupe.data.DataLoader(Marked(10), batch_size=2, pin_memory=True)
    # timeout: item 5 takes 5 s; torch's message.
    slow = troupe.data.DataLoader(Marked(40, slow=5), batch_size=4, num_workers=1, timeout=1,
                                  in_order=True)
    try:
        for _ in slow:
            pass
        fail("a 5 s item within timeout=1")
    except RuntimeError as e:
        print(f"check: timeout: RuntimeError: {e}", flush=True)


class Values(torch.utils.data.Dataset):
    """Defined before the first DataLoader: a later loader's dataset of this class reaches the
    data instances pickled."""

    def __init__(self, size, offset):
        self.size, self.offset = size, offset

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return self.offset + i, HOST


def loaders():
    train = troupe.data.DataLoader(Values(300, 0), batch_size=16, shuffle=True, num_workers=2)
    validation = troupe.data.DataLoader(Values(100, 10000), batch_size=16, num_workers=1)
    test = troupe.data.DataLoader(Values(50, 20000), batch_size=16, local=True, num_workers=0)
    for epoch in range(2):
        for name, loader, size, offset in (("train", train, 300, 0),
                                           ("validation", validation, 100, 10000),
                                           ("test", test, 50, 20000)):
            values, hosts = [], set()
            for v, h in loader:
                values.extend(v.tolist())
                hosts.update(h)
            once = sorted(values) == list(range(offset, offset + size))
            report = loader.epoch_reports.get(epoch, {})
            print(f"check: epoch {epoch}: {name}: {len(values)} items, each once {once}, made "
                  f"on {'this instance' if hosts == {HOST} else 'the data group'}, report "
                  f"{report.get('samples')}", flush=True)
    # A later loader's collate_fn that cannot be pickled: refused at once, naming the way out.
    try:
        troupe.data.DataLoader(Values(10, 0), batch_size=2, collate_fn=lambda batch: batch)
        fail("a lambda collate_fn reached the data group")
    except TypeError as e:
        if "local=True" not in str(e):
            fail(f"the TypeError names no alternative: {e}")
        print(f"check: a lambda in a later loader: TypeError: {e}", flush=True)


def peek():
    loader = troupe.data.DataLoader(Values(200, 0), batch_size=10, shuffle=True, num_workers=1)
    first = next(iter(loader))
    print(f"check: peeked {len(first[0])} items", flush=True)
    for epoch in range(2):
        n = sum(len(v) for v, _ in loader)
        print(f"check: epoch {epoch}: {n} items", flush=True)
    epochs = {e: r["samples"] for e, r in sorted(loader.epoch_reports.items())}
    peeks = [(p["epoch"], p["taken"], p["abandoned"]) for p in loader.peeks]
    print(f"check: reports {epochs}, peeks {peeks}", flush=True)
    labelled = troupe.data.DataLoader(Values(50, 0), batch_size=10, num_workers=1)
    for epoch in (5, 6):
        labelled.set_epoch(epoch)
        for _ in labelled:
            pass
    print(f"check: set_epoch reports {sorted(labelled.epoch_reports)}", flush=True)


def badfile():
    import torchvision
    from PIL import Image
    root = ARG
    for k in range(12):
        folder = os.path.join(root, f"class{k % 2}")
        os.makedirs(folder, exist_ok=True)
        Image.new("RGB", (8 + k, 8), (k * 10, 0, 0)).save(os.path.join(folder, f"{k}.png"))
    with open(os.path.join(root, "class1", "broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a JPEG")
    dataset = torchvision.datasets.ImageFolder(
        root, transform=torchvision.transforms.Compose([
            torchvision.transforms.Resize((8, 8)), torchvision.transforms.ToTensor()]))
    # translate=False: torchvision's own loading in Python workers (translated, troupe's C++
    # decode would refuse the file: images_train_test.cpp's cases).
    loader = troupe.data.DataLoader(dataset, batch_size=4, num_workers=2, translate=False)
    for _ in loader:
        pass
    fail("the corrupt JPEG was read")


def lie_about_shapes(worker_id):
    # Each reply of the worker claims 1000 more rows for its first tensor than its bytes hold.
    import troupe._workers as workers
    made = workers._make

    def lying(*args):
        reply = made(*args)
        if reply.get("tensors"):
            reply["tensors"][0]["shape"][0] += 1000
        return reply
    workers._make = lying


def lying():
    dataset = [(torch.full((4,), float(i)), i) for i in range(256)]
    loader = troupe.data.DataLoader(dataset, batch_size=32, num_workers=1,
                                    worker_init_fn=lie_about_shapes)
    for x, _ in loader:
        if x.shape[0] != 32 or x.numel() != 32 * 4:
            fail(f"a batch of shape {tuple(x.shape)} reached the script")
    fail("every batch was taken, the lying ones too")


def images():
    spec = "RandomResizedCrop(16),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),Normalize(imagenet)"
    # The dataset's own seed (its epoch from the loader's set_epoch), and the loader's seed alone.
    own = troupe.data.DataLoader(troupe.data.ImageDataset(ARG, spec, seed=1), batch_size=50,
                                 with_ids=True, num_workers=1)
    loaders_seed = troupe.data.DataLoader(troupe.data.ImageDataset(ARG, spec), batch_size=50,
                                          shuffle=True, seed=5, with_ids=True, num_workers=1)
    for epoch in range(2):
        for name, loader in (("own seed", own), ("loader's seed", loaders_seed)):
            loader.set_epoch(epoch)
            pixels = {}
            for (x, _), ids in loader:
                for i, image in zip(ids.tolist(), x):
                    pixels[i] = round(float(image.double().sum()), 3)
            digest = hashlib.sha256(repr(sorted(pixels.items())).encode()).hexdigest()[:16]
            print(f"check: epoch {epoch}: {name}: {len(pixels)} samples, pixels {digest}",
                  flush=True)


def translated():
    import torchvision
    import torchvision.transforms as T
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    train = torchvision.datasets.ImageFolder(ARG, transform=T.Compose([
        T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
        T.ToTensor(), T.Normalize(*imagenet)]))
    # No random draw: a first CenterCrop (no DCT-scaled decode) gives torchvision's tensors; a
    # first Resize decodes a JPEG at a DCT scale where it can (troupe's default), within 2 levels.
    fixed = torchvision.datasets.ImageFolder(ARG, transform=T.Compose([
        T.CenterCrop(24), T.Resize((16, 16)), T.ToTensor(), T.Normalize(*imagenet)]))
    scaled = torchvision.datasets.ImageFolder(ARG, transform=T.Compose([
        T.Resize((20, 24)), T.CenterCrop(16), T.ToTensor(), T.Normalize(*imagenet)]))
    python = torchvision.datasets.ImageFolder(ARG, transform=T.Compose([
        T.RandomResizedCrop(16), T.RandAugment(), T.ToTensor()]))
    loader = troupe.data.DataLoader(train, batch_size=50, shuffle=True, seed=3, with_ids=True,
                                    num_workers=1)
    for epoch in range(2):
        seen = collections.Counter()
        for batch, ids in loader:
            if not isinstance(batch, list) or len(batch) != 2:
                fail(f"a batch that is not default_collate's [images, targets]: {type(batch)}")
            x, y = batch
            if x.dtype != torch.float32 or tuple(x.shape[1:]) != (3, 16, 16):
                fail(f"images of {x.dtype} {tuple(x.shape)}")
            wrong = [i for i, t in zip(ids.tolist(), y.tolist()) if train.targets[i] != t]
            if wrong:
                fail(f"targets other than torchvision's for samples {wrong[:5]}")
            seen.update(ids.tolist())
        once = sum(1 for i in range(len(train)) if seen[i] == 1)
        print(f"check: epoch {epoch}: {once} of {len(train)} samples once, targets "
              "torchvision's", flush=True)
    # Deterministic: the data group's tensors are torchvision's own, to float rounding.
    worst = 0.0
    for (x, _), ids in troupe.data.DataLoader(fixed, batch_size=64, with_ids=True, num_workers=1):
        for image, i in zip(x, ids.tolist()):
            worst = max(worst, float((image - fixed[i][0]).abs().max()))
    print(f"check: a fixed Compose against torchvision's: max |diff| {worst:.2g}", flush=True)
    if worst > 1e-5:
        fail(f"the translated Compose's tensors differ from torchvision's by {worst}")
    levels = torch.tensor(imagenet[1]).view(3, 1, 1) * 255  # a normalised unit in levels
    means = []
    for (x, _), ids in troupe.data.DataLoader(scaled, batch_size=64, with_ids=True,
                                              num_workers=1):
        for image, i in zip(x, ids.tolist()):
            means.append(float(((image - scaled[i][0]).abs() * levels).mean()))
    mean = sum(means) / len(means)
    print(f"check: a first Resize (DCT-scaled decodes) against torchvision's: {mean:.2f} levels "
          f"of 255 on average", flush=True)
    if mean > 2:
        fail(f"a first Resize's tensors differ from torchvision's by {mean} levels on average")
    for name, dataset, options in (("translate=False", fixed, {"translate": False}),
                                   ("RandAugment", python, {})):
        count = sum(len(y) for _, y in troupe.data.DataLoader(dataset, batch_size=64,
                                                                 num_workers=1, **options))
        print(f"check: {name}: {count} samples through Python workers", flush=True)


{"parallel": parallel, "random": random_mode, "args": args_mode, "loaders": loaders, "peek": peek,
 "badfile": badfile, "lying": lying, "images": images, "translated": translated}[MODE]()
print("check: done", flush=True)
