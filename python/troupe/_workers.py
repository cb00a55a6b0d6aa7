"""troupe.data.DataLoader's worker processes: what each one runs (``worker_main``: the items of
each batch the node asks for and ``collate_fn`` of them, the tensors into a slot of its shared
memory; troupe/train/worker_pool.h has the protocol), how it seeds itself as torch's workers do
and, per sample, past them, and the batch structure it hands over.

Seeding. When a request of a new pass arrives, the worker does what torch's worker loop does at
its start: ``seed = base_seed + worker number`` (the number distinct across instances, so that no
two workers of the job share a stream), ``random.seed``, ``torch.manual_seed``, numpy's legacy
global from torch's own ``_generate_state``, ``torch.utils.data.get_worker_info()`` set, and
``worker_init_fn(worker_id)`` (once with ``persistent_workers``, each pass without, as torch's
workers are made again each epoch). Then, with per-sample seeding (the default), the three
generators are seeded again before each item from (base seed, the item's position in the pass):
whichever worker on whichever instance makes sample i of a pass, it draws the same numbers.
"""

import importlib
import json
import math
import os
import pickle
import random
import struct
import sys
import traceback

from troupe._common import _native, _torch, numpy

# The seed of the item being made (per-sample seeding), or None: troupe.data.ImageDataset takes
# its pixels' seed from it, so that its C++ transform draws what the data group's would.
current_sample_seed = None


def in_cluster():
    """Whether this process runs as an instance of a troupe job (troupe sim, SageMaker, Slurm,
    Kubernetes, or a cluster file given): else a plain ``python3 train.py``."""
    env = os.environ
    return bool(env.get("TROUPE_SM_ROOT") or env.get("TROUPE_CLUSTER_FILE") or
                env.get("SLURM_JOB_ID") or env.get("KUBERNETES_SERVICE_HOST") or
                os.path.exists("/opt/ml/input/config/resourceconfig.json") or
                any(a == "--cluster" or a.startswith("--cluster=") for a in sys.argv))


def cpu_list(text):
    """"0-3,6" -> {0, 1, 2, 3, 6} (the kernel's CPU list syntax, as TROUPE_CPUS has it)."""
    cpus = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


# The last line of a worker's traceback: the class of the exception it raised.
RAISED_AS = "troupe.data: raised as "


# Tensor dtypes numpy has no dtype for: they travel as the integers of their size, and are
# viewed as themselves again on the trainer's side.
_VIEWED = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8",
           "float8_e4m3fnuz": "uint8", "float8_e5m2fnuz": "uint8"}


def flatten(value, tensors):
    """A collated batch as a JSON-able structure over a flat list of arrays: tensors (of any
    dtype), numpy arrays, numbers (NaN and infinities too), strings and None in tuples, lists and
    dicts, their subclasses (a namedtuple, an OrderedDict) kept by name."""
    torch = _torch()
    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if name in _VIEWED:
            tensors.append(t.view(getattr(torch, _VIEWED[name])).numpy())
            return {"t": len(tensors) - 1, "as": name}
        tensors.append(t.numpy())
        return {"t": len(tensors) - 1}
    if isinstance(value, numpy.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(f"DataLoader: a collated batch holds a numpy array of dtype "
                            f"{value.dtype.str}; batches carry numeric arrays (bool, int, uint, "
                            "float, complex): give strings as a list (default_collate does)")
        tensors.append(numpy.ascontiguousarray(value))
        return {"t": len(tensors) - 1, "numpy": True}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"namedtuple": _class_path(value), "items": [flatten(v, tensors) for v in value]}
    for kind, cls in (("tuple", tuple), ("list", list)):
        if isinstance(value, cls):
            out = {kind: [flatten(v, tensors) for v in value]}
            if type(value) is not cls:
                out["class"] = _class_path(value)
            return out
    if isinstance(value, dict):
        out = {"dict": [[k, flatten(v, tensors)] for k, v in value.items()]}
        if type(value) is not dict:
            out["class"] = _class_path(value)
        return out
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # (JSON has no NaN or infinity)
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"DataLoader: a collated batch holds a {type(value).__name__}; batches carry "
                    "tensors, numpy arrays, numbers and strings in tuples, lists and dicts")


def _class_path(value):
    cls = type(value)
    return f"{cls.__module__}:{cls.__qualname__}"


def _class_of(path):
    """The class a worker named (the script's own classes are the trainer's: one script)."""
    module, _, name = path.partition(":")
    try:
        found = sys.modules.get(module) or importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        return found
    except (ImportError, AttributeError):
        return None


def unflatten(structure, tensors):
    """A batch as flatten() described it, over the received tensors."""
    if "t" in structure:
        t = tensors[structure["t"]]
        if "as" in structure:
            return t.view(getattr(_torch(), structure["as"]))
        return t.numpy() if structure.get("numpy") else t
    if "namedtuple" in structure:
        items = [unflatten(v, tensors) for v in structure["items"]]
        cls = _class_of(structure["namedtuple"])
        return cls(*items) if cls is not None else tuple(items)
    for kind, make in (("tuple", tuple), ("list", list)):
        if kind in structure:
            items = [unflatten(v, tensors) for v in structure[kind]]
            cls = _class_of(structure["class"]) if "class" in structure else None
            return cls(items) if cls is not None else make(items)
    if "dict" in structure:
        items = {k: unflatten(v, tensors) for k, v in structure["dict"]}
        cls = _class_of(structure["class"]) if "class" in structure else None
        return cls(items) if cls is not None else items
    if "float" in structure:
        return float(structure["float"])
    return structure["v"]


def sample_file(dataset, index):
    """The file sample `index` comes from, where the dataset says (torchvision's ImageFolder and
    DatasetFolder: ``samples[i][0]``; ``imgs``; troupe's ImageDataset), else None."""
    try:
        for name in ("samples", "imgs"):
            entries = getattr(dataset, name, None)
            if entries is not None:
                entry = entries[index]
                path = entry[0] if isinstance(entry, (tuple, list)) else entry
                if isinstance(path, (str, os.PathLike)):
                    return os.fspath(path)
        source = getattr(dataset, "source", None)
        if source is not None and hasattr(source, "name"):
            return source.name(index)
    except Exception:  # noqa: BLE001 - a name is a courtesy; the error itself is what matters
        pass
    return None


class WorkerSpec:
    """What a loader's workers run: built from the DataLoader on every instance (the first
    loader's is in the fork server's memory; a later loader's reaches it pickled)."""

    def __init__(self, dataset, collate_fn, worker_init_fn, persistent_workers, skip_errors,
                 per_sample_seed, auto_collation):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.skip_errors = skip_errors
        self.per_sample_seed = per_sample_seed
        self.auto_collation = auto_collation


def seed_everything(seed, numpy_seed):
    """random, torch and numpy's legacy global generator, as torch's worker loop seeds them."""
    torch = _torch()
    random.seed(seed)
    torch.manual_seed(seed)
    numpy.random.seed(numpy_seed)


def pass_seed(base_seed, passes):
    """The seed a pass's per-sample seeds derive from: the pass's base seed, or, for the
    `passes`-th pass (1, 2, ...) of persistent workers (whose base seed is drawn once, as torch's),
    one of its own from it - the workers' streams go on each epoch, so no epoch redraws another's
    numbers."""
    if passes == 0:
        return base_seed
    return _native.sample_seed(base_seed, (1 << 63) | passes)


def keeping_rng(make):
    """`make()` with the calling process's random, torch and numpy global generators as they
    were: an item made in the script's own process (num_workers=0) is seeded per sample without
    changing the script's own draws (as an item made in a worker)."""
    torch = _torch()
    saved = torch.get_rng_state(), random.getstate(), numpy.random.get_state()
    try:
        return make()
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        numpy.random.set_state(saved[2])


def seed_item(seed):
    """An item's per-sample seed into random, torch's CPU generator and numpy's legacy global
    one (from 32 bits of it: numpy's fast seeding) - about 11 us, where torch.manual_seed() (every
    device's generator) and a 64-bit numpy seed take 70 (bench_dataloader.py, "per-sample
    seeds")."""
    random.seed(seed)
    _torch().default_generator.manual_seed(seed)
    numpy.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)


class DatasetChanges:
    """What the script changed of its Dataset since it made the DataLoader (the workers' copy:
    the fork server's, or the pickled one of a later loader): the attributes (``vars()``) now
    another object, or a container now of another length - `ds.transform = ...` for progressive
    resizing, `ds.difficulty = 3` - sent pickled with each pass (PassPlan::update), as torch's
    workers, made again each epoch, see the dataset as it is. A change inside an object of the
    same identity and length (`ds.samples[3] = ...`) is not seen."""

    LIMIT = 64 << 10  # bytes a pass's changes may pickle to (they travel with each shard)

    def __init__(self, dataset):
        self.dataset = dataset
        self.made = self._fingerprints()

    def _fingerprints(self):
        try:
            items = vars(self.dataset).items()
        except TypeError:  # (no __dict__: nothing seen)
            return {}
        prints = {}
        for name, value in items:
            if value is None or isinstance(value, (bool, int, float, str, bytes)):
                prints[name] = ("value", value)  # (an equal number assigned again: no change)
            else:
                size = len(value) if isinstance(value, (list, dict, set, tuple)) else None
                prints[name] = (id(value), size)
        return prints

    def pickled(self):
        """The changed attributes, pickled, or b"" when none changed."""
        now = self._fingerprints()
        changed = sorted(k for k in now if self.made.get(k) != now[k])
        gone = sorted(k for k in self.made if k not in now)
        if not changed and not gone:
            return b""
        values = {k: getattr(self.dataset, k) for k in changed}
        try:
            data = pickle.dumps((values, gone), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - pickle raises many kinds
            raise TypeError(f"DataLoader: the dataset's {', '.join(changed)} changed since the "
                            f"DataLoader was made and cannot be pickled for its workers on the "
                            f"data group ({type(e).__name__}: {e})") from e
        if len(data) > self.LIMIT:
            raise ValueError(
                f"DataLoader: the dataset's {', '.join(changed)} changed since the DataLoader was "
                f"made: {len(data) >> 10} KiB pickled, over the {self.LIMIT >> 10} KiB a pass's "
                "changes may be (they travel to the data group's workers with each pass). Change "
                "it from the epoch in the dataset's own set_epoch(epoch), which troupe calls in "
                "every worker before each pass, or make a new DataLoader over it")
        return data


class _Pass:
    """Where a worker is: the pass it makes items of, whether its init ran, and the values of
    its dataset's attributes before a pass's changes set them (restored when a later pass does
    not change them)."""

    def __init__(self):
        self.number = None
        self.initialised = False
        self.originals = {}


_MISSING = object()


def _apply_changes(dataset, state, update):
    """The script's changes to its Dataset (DatasetChanges), on this worker's copy: each pass
    holds every change since the DataLoader was made, so an attribute it does not name is as the
    copy had it."""
    values, gone = pickle.loads(update) if update else ({}, [])
    for name in list(state.originals):
        if name not in values and name not in gone:
            original = state.originals.pop(name)
            if original is _MISSING:
                delattr(dataset, name)
            else:
                setattr(dataset, name, original)
    for name, value in values.items():
        state.originals.setdefault(name, getattr(dataset, name, _MISSING))
        setattr(dataset, name, value)
    for name in gone:
        if hasattr(dataset, name):
            state.originals.setdefault(name, getattr(dataset, name))
            delattr(dataset, name)


def _start_pass(spec, conn, state, number, label, base_seed, update):
    _torch()
    from torch.utils.data._utils import worker as torch_worker
    state.number = number
    if not spec.persistent_workers:
        _apply_changes(spec.dataset, state, update)
    # torch's _worker_loop: seed = base_seed + worker_id, numpy from _generate_state. The number
    # added is the worker's in the whole job (its instance's offset + its id), so that workers of
    # two instances never draw the same stream.
    number_in_job = (conn["seed_offset"] + conn["worker"]) % 2**64
    seed = (base_seed + number_in_job) % 2**64
    if not (spec.persistent_workers and state.initialised):
        # (Persistent workers are seeded once: their streams go on from epoch to epoch.)
        seed_everything(seed, torch_worker._generate_state(base_seed, number_in_job))
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=conn["worker"], num_workers=conn["workers"], seed=seed, dataset=spec.dataset)
    if hasattr(spec.dataset, "set_epoch"):
        spec.dataset.set_epoch(label)  # the script's epoch, as it would call it before iter()
    if spec.worker_init_fn is not None and (not spec.persistent_workers or not state.initialised):
        spec.worker_init_fn(conn["worker"])
    state.initialised = True


def _describe(spec, conn, index, error, label, where_too=True):
    """`dataset[i] (its file) raised E: why`, and where (the epoch, the worker, the instance)
    unless it names a skipped sample (reports list each sample skipped once)."""
    what = "collate_fn" if index is None else f"dataset[{index}]"
    path = None if index is None else sample_file(spec.dataset, index)
    if path:
        what += f" ({path})"
    text = f"{what} raised {type(error).__name__}: {error}"
    if not where_too:
        return text
    return (f"{text} (epoch {label}, DataLoader worker {conn['worker']} of {conn['workers']} on "
            f"{conn['host']})")


def _make(spec, conn, state, view, header, ids):
    """One request: the items, collated, into the request's slot. Returns the reply."""
    global current_sample_seed
    number, label, base_seed, places, slot, update = header
    index = None
    skipped = []
    try:
        if state.number != number:
            _start_pass(spec, conn, state, number, label, base_seed, update)
        samples = []
        for k, index in enumerate(ids):
            if spec.per_sample_seed:
                current_sample_seed = _native.sample_seed(base_seed, places[k])
                seed_item(current_sample_seed)
            try:
                samples.append(spec.dataset[index])
            except Exception as e:  # noqa: BLE001 - the user's code: any exception is a sample's
                if not spec.skip_errors:
                    raise
                skipped.append([index, _describe(spec, conn, index, e, label, False)])
        index = None
        current_sample_seed = None
        tensors = []
        if not samples:
            structure = {"v": None}
        elif spec.auto_collation:
            structure = flatten(spec.collate_fn(samples), tensors)
        else:
            structure = flatten(spec.collate_fn(samples[0]), tensors)
        infos, offset, size = [], 0, conn["slot_bytes"]
        base = slot * size
        for a in tensors:
            if offset + a.nbytes > size:
                raise MemoryError(
                    f"a batch of {offset + a.nbytes} bytes: more than a slot of the worker's "
                    f"shared memory ({size} bytes: shared_memory_mb / prefetch_factor; raise "
                    "DataLoader(shared_memory_mb=...))")
            view[base + offset:base + offset + a.nbytes] = a.reshape(-1).view(numpy.uint8)
            infos.append({"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                          "bytes": a.nbytes})
            offset += (a.nbytes + 63) // 64 * 64
        return {"structure": structure, "tensors": infos, "skipped": skipped}
    except Exception as e:  # noqa: BLE001
        current_sample_seed = None
        # The exception's class, by name, on the traceback's last line: the script's loop gets
        # one of it (troupe/_common.py, worker_exception), as torch's DataLoader re-raises it.
        return {"error": _describe(spec, conn, index, e, label),
                "traceback": traceback.format_exc() + f"{RAISED_AS}{_class_path(e)}\n"}


def worker_main(spec, conn, request, reply, memory):
    """A DataLoader worker process: answers the node's requests (troupe/train/worker_pool.h) until
    its request pipe closes. Never returns."""
    import mmap
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: never outlive the fork server
    except Exception:  # noqa: BLE001 - best effort, as torch's workers watch their parent
        pass
    torch = _torch()
    torch.set_num_threads(1)  # as torch's workers: one thread each, the CPUs are the workers'
    size = conn["slot_bytes"] * conn["slots"]
    view = numpy.frombuffer(mmap.mmap(memory, size), dtype=numpy.uint8)
    state = _Pass()
    head = struct.Struct("<IIQII")
    while True:
        data = _read_exact(request, head.size)
        if data is None:
            os._exit(0)
        number, label, base_seed, slot, n = head.unpack(data)
        body = _read_exact(request, 12 * n)
        if body is None:
            os._exit(0)
        ids = struct.unpack_from(f"<{n}I", body)
        places = struct.unpack_from(f"<{n}Q", body, 4 * n)
        length = _read_exact(request, 4)
        update = _read_exact(request, struct.unpack("<I", length)[0]) if length else None
        if length is None or update is None:
            os._exit(0)
        answer = _make(spec, conn, state, view,
                       (number, label, base_seed, places, slot, update), ids)
        answer["slot"] = slot
        text = json.dumps(answer).encode()
        _write_all(reply, struct.pack("<I", len(text)) + text)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data
