"""Augmented batches from troupe's data group, as PyTorch tensors (docs/pytorch.md).

One command runs on every instance (``troupe sim ... -- python3 train.py``, or SageMaker's entry
point). Creating an :class:`AugmentedBatches` starts the process's troupe job: on the head (the
dnn group's first instance) it returns and the script trains; on every data instance it never
returns - the process serves troupe's augmenters until the job ends, and exits with the job's
exit code, as every troupe process does.

    stream = troupe.data.AugmentedBatches(batch_size=128, epochs=5)
    for epoch in stream.epochs():
        for images, labels in epoch:      # torch tensors
            ...                           # the unchanged PyTorch step

Semantics (exactly the C++ trainer's): every training sample arrives once per epoch, counted by
the trainer and reported (:meth:`AugmentedBatches.report`); a lost data instance costs throughput,
never samples; a batch counts as trained once the script asks for the next one, or for
:meth:`AugmentedBatches.state_dict`. When the job is stopped (SIGTERM on any instance), the next
batch raises :class:`Stopped`: save ``stream.state_dict()`` with the model and end; a new run that
calls :meth:`AugmentedBatches.load_state_dict` first continues exactly where it stopped. A script
that ends with an exception fails the job: every process exits 1 (JOB_FAILED) and the failure
file names the exception.
"""

import atexit
import os
import sys
import traceback

__all__ = ["AugmentedBatches", "Stopped", "JobFailed", "StateError", "ImageDataset"]


class Stopped(Exception):
    """The job is stopping (SIGTERM or SIGINT on some instance): save the state and end."""


class JobFailed(RuntimeError):
    """The data side failed for good (every augmenter is gone, the trainer failed)."""


try:
    import numpy  # noqa: F401  (the native module returns numpy arrays)
    from troupe import _native
    StateError = _native.StateError
except ImportError as e:  # pragma: no cover - reported to the user as is
    raise ImportError(f"troupe.data needs troupe's native module and numpy: {e}") from e


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("troupe.data yields torch tensors: install PyTorch (python3-torch)") from e
    return torch


_OPTIONS = ("prefetch", "seed", "train_samples", "augment", "blur", "augmenters_per_node",
            "restarts", "stop_timeout", "data_dir", "data_group", "dataset", "transform",
            "skip_bad_samples", "shuffle", "drop_last")


class _Ending:
    """How the script ended, for the job: set by the exception hook, read at exit."""

    failure = None

    @classmethod
    def install(cls):
        previous = sys.excepthook

        def hook(kind, value, tb):
            if issubclass(kind, Stopped):
                print(f"troupe.data: the job was stopped ({value}); the script ended",
                      file=sys.stderr, flush=True)
                return
            line = traceback.format_exception_only(kind, value)[-1].strip()
            cls.failure = f"{line} (the training script's exception; its traceback is in the log)"
            previous(kind, value, tb)

        sys.excepthook = hook
        atexit.register(cls.end)

    @classmethod
    def end(cls):
        sys.stdout.flush()
        sys.stderr.flush()
        _native.end(cls.failure or "")  # ends the process with the job's exit code


class Epoch(int):
    """One epoch: its number (0-based, an int) and its batches (iterate them once, to the end)."""

    def __new__(cls, stream, number):
        epoch = super().__new__(cls, number)
        epoch._stream = stream
        return epoch

    @property
    def number(self):
        return int(self)

    def __iter__(self):
        while True:
            item = self._stream._next()
            kind, epoch = item[0], item[1]
            if kind == "epoch_end":
                return
            yield self._stream._tensors(item)

    def __repr__(self):
        return f"Epoch({int(self)})"

    __str__ = int.__repr__  # f"{epoch}" is its number, as for an int


class AugmentedBatches:
    """Batches augmented on the data group, as ``(images, labels)`` torch tensors.

    ``images`` is float32 ``(N, 1, 28, 28)``, normalised as the C++ trainer normalises
    (``normalize=False``: uint8 pixels x 255, the received buffer itself, no copy); ``labels`` is
    int64 ``(N,)``. ``with_ids=True`` adds the batch's sample ids (int64) as a third tensor.

    ``batch_size``, ``epochs``, ``seed``, ``train_samples`` (0: all 60,000), ``augment``
    ("heavy" or "light"), ``blur``, ``prefetch`` (batches in flight per augmenter),
    ``augmenters_per_node`` (0: one per vCPU), ``restarts``, ``data_dir``, ``data_group`` and
    ``stop_timeout`` (seconds the script has to save after a stop) mean what hetero_train's flags
    of those names mean (docs/hetero_train.md).

    Your own data (docs/data.md): ``dataset`` (an ImageFolder, a CSV or JSON-lines manifest,
    WebDataset ``.tar`` shards, or IDX files), ``transform`` (a torchvision-style spec such as
    ``"RandomResizedCrop(224),RandomHorizontalFlip(),Normalize(imagenet)"``, the default) and
    ``skip_bad_samples``. The data group decodes and transforms it; ``images`` come as the
    transform writes them - float32 ``(N, C, H, W)`` after Normalize, uint8 ``(N, H, W, C)``
    without, float16 with ``ToDtype(float16)`` - and ``labels`` are the dataset's targets (int64).
    ``normalize`` applies to Fashion-MNIST only. With a dataset each epoch is cut as torch's
    ``DataLoader`` cuts it: ``shuffle`` (default True) the samples, every batch ``batch_size`` but
    the epoch's last (left out with ``drop_last=True``), batch k the same samples whichever
    instance serves it. ``on_stop``: called when the job is stopping,
    before :class:`Stopped` is raised (save the model and ``state_dict()`` there). ``pin_memory``
    (default: whether CUDA is available) returns page-locked tensors, a copy of each batch.
    """

    def __init__(self, batch_size=128, epochs=5, *, normalize=True, with_ids=False, on_stop=None,
                 pin_memory=None, **options):
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"AugmentedBatches: unknown option(s) {', '.join(unknown)}; "
                            f"the options are {', '.join(_OPTIONS)}")
        if options.get("augment", "heavy") not in ("heavy", "light"):
            raise ValueError(f"AugmentedBatches: augment={options['augment']!r}: "
                             "use 'heavy' or 'light'")
        if batch_size < 1 or epochs < 1:
            raise ValueError(f"AugmentedBatches: batch_size={batch_size}, epochs={epochs}: "
                             "both must be at least 1")
        self.batch_size = batch_size
        self.total_epochs = epochs
        self._normalize = normalize
        self._with_ids = with_ids
        self._on_stop = on_stop
        self._torch = _torch()
        # Page-locked images, for an asynchronous copy to the GPU (.to(device, non_blocking=True)):
        # by default where CUDA is available. Pinning is a copy of the batch.
        self._pin = self._torch.cuda.is_available() if pin_memory is None else pin_memory
        self._report = None
        self._pid = os.getpid()
        self._first_epoch = 0
        self._begun = False
        sys.stdout.flush()
        sys.stderr.flush()
        # The script's prints a line at a time, as troupe::run() has printf's: under troupe sim or
        # SageMaker stdout is a pipe, and block-buffered lines would come after the log lines.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)
        settings = dict(options, batch_size=batch_size, epochs=epochs)
        # Returns on the head only; on a data instance the process serves until the job ends.
        _native.start([sys.argv[0] or "python3"] + sys.argv[1:], settings)
        _Ending.install()
        print(_native.placements(), flush=True)

    # -- iteration --
    def epochs(self):
        """The epochs still to train (after :meth:`load_state_dict`, from the one it stopped in),
        each an iterable of batches."""
        self._begin()
        for number in range(self._first_epoch, self.total_epochs):
            yield Epoch(self, number)
        item = self._next()
        if item[0] != "finished":
            raise JobFailed(f"troupe.data: expected the end of training, got {item[0]}")

    def __iter__(self):
        """Every batch of every epoch, in order (the IterableDataset form)."""
        for epoch in self.epochs():
            yield from epoch

    def as_dataset(self):
        """A ``torch.utils.data.IterableDataset`` over every batch (use ``batch_size=None`` and
        ``num_workers=0`` in the DataLoader: the batches are made on the data group)."""
        stream = self

        class _Dataset(self._torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter(stream)

        return _Dataset()

    # -- state --
    def state_dict(self):
        """The stream's position: each shard's acknowledged position in the epoch in progress,
        the samples it has trained on, its counters. The batch received last counts as trained."""
        return {"troupe_stream": _native.state(), "version": 1}

    def load_state_dict(self, state):
        """Resume from what :meth:`state_dict` returned in an earlier run of this job (same batch
        size, seed, epochs and samples). Call it before the first epoch."""
        if not isinstance(state, dict) or "troupe_stream" not in state:
            raise StateError("load_state_dict: not a troupe.data state_dict() (no 'troupe_stream')")
        if self._begun:
            raise RuntimeError("load_state_dict() after the stream started: call it first")
        self._first_epoch = _native.load_state(bytes(state["troupe_stream"]), "the stream's state_dict()")

    def report(self):
        """Every epoch's counts as the trainer kept them (samples, duplicates, missing, rejected
        batches, a digest of the ids): available once every epoch was iterated."""
        return self._report

    # -- internals --
    def _begin(self):
        if not self._begun:
            self._begun = True
            _native.begin()

    def _next(self):
        if os.getpid() != self._pid:
            raise RuntimeError("AugmentedBatches cannot be iterated in a forked process (a "
                               "DataLoader worker): use num_workers=0, the batches are made on "
                               "the data group")
        item = _native.next(self._normalize)
        kind = item[0]
        if kind == "stopped":
            if self._on_stop is not None:
                self._on_stop()  # saves the state (state_dict()) before the script ends
            raise Stopped("SIGTERM or SIGINT on an instance of the job")
        if kind == "failed":
            raise JobFailed(f"troupe.data: {item[2]}")
        if kind == "finished":
            import json
            self._report = json.loads(item[2])
        return item

    def _tensors(self, item):
        torch = self._torch
        images = torch.from_numpy(item[2])
        labels = torch.from_numpy(item[3])
        if self._pin:
            images, labels = images.pin_memory(), labels.pin_memory()
        if self._with_ids:
            return images, labels, torch.from_numpy(item[4])
        return images, labels


def fashion_mnist(split="train", data_dir="/usr/share/datasets/fashion-mnist"):
    """Fashion-MNIST from its Debian package: ``(images, labels)`` as uint8 ``(N, 28, 28)`` and
    int64 ``(N,)`` torch tensors (``split``: "train" or "test")."""
    torch = _torch()
    if split not in ("train", "test"):
        raise ValueError(f"fashion_mnist: split={split!r}: use 'train' or 'test'")
    images, labels = _native.fashion_mnist(split, data_dir)
    return torch.from_numpy(images), torch.from_numpy(labels)


def normalize(images):
    """uint8 pixels to float32 ``(N, 1, 28, 28)``, normalised as the stream's images are."""
    torch = _torch()
    return ((images.float() / 255.0) - 0.2860) / 0.3530


class FashionMNIST:
    """A map-style dataset over Fashion-MNIST's training set, each sample augmented in the
    calling process with troupe's augmenter (the same pipeline as the data group's): what a plain
    PyTorch script uses with ``DataLoader(num_workers=N)`` on its own CPUs."""

    def __init__(self, augment="heavy", train_samples=0,
                 data_dir="/usr/share/datasets/fashion-mnist"):
        torch = _torch()
        images, labels = _native.fashion_mnist("train", data_dir)
        n = train_samples or len(labels)
        self.images, self.labels = images[:n], labels[:n]
        self.augmenter = _native.Augmenter(augment)
        self._torch = torch

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        seed = int(self._torch.randint(0, 2**62, (1,)))
        image = self.augmenter.augment(self.images[index:index + 1], seed)[0]
        return self._torch.from_numpy(image), int(self.labels[index])


class ImageDataset:
    """A map-style dataset over your own images, decoded and transformed in the calling process
    by troupe's C++ pipeline (docs/data.md): an ImageFolder, a manifest (.csv, .jsonl), WebDataset
    .tar shards or Fashion-MNIST's files, found from what is at ``path``, and a transform spec with
    torchvision's names. Each item is ``(tensor, target)``; use it with ``DataLoader`` as any
    dataset::

        ds = troupe.data.ImageDataset("/data/train", "RandomResizedCrop(224),"
                                      "RandomHorizontalFlip(),Normalize(imagenet)", seed=42)
        for epoch in range(5):
            ds.set_epoch(epoch)
            for x, y in DataLoader(ds, batch_size=64, shuffle=True, num_workers=4): ...

    With ``seed``, the random choices of sample ``i`` in epoch ``e`` depend on (seed, e, i) only:
    the same pixels in any worker and any run. Without it, each call draws a fresh seed, as
    torchvision's transforms do. A bad spec raises ValueError naming what is allowed; a dataset
    that cannot be used, RuntimeError naming the path; a sample that cannot be read or decoded,
    RuntimeError naming its file."""

    def __init__(self, path, transform, seed=None):
        self._torch = _torch()
        self.source = _native.open_dataset(str(path))
        self.transform = _native.Transform(transform)
        self.transform.shape(3)  # a spec that fixes no size, or a wrong Normalize: now, not later
        self.classes = list(self.source.classes)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        """The epoch the next items belong to (with ``seed``: other random choices each epoch)."""
        self.epoch = int(epoch)

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        if index < 0:
            index += len(self)
        encoded, target = self.source.read(index)
        if self.seed is None:
            seed = int(self._torch.randint(0, 2**62, (1,)))
        else:
            seed = (int(self.seed) * 0x9E3779B97F4A7C15 + self.epoch * 0x100000001B3 + index) % 2**64
        x = self.transform(encoded, seed, self.source.name(index))
        return self._torch.from_numpy(x), int(target)
