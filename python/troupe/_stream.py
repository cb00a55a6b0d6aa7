"""troupe.data.AugmentedBatches: batches troupe's C++ augmenters make on the data group
(Fashion-MNIST's presets, or a dataset through a transform spec), as torch tensors
(docs/pytorch.md)."""

import json
import os

from troupe._common import Ending, JobFailed, Process, StateError, _native, _torch, next_item

_OPTIONS = ("prefetch", "seed", "train_samples", "augment", "blur", "augmenters_per_node",
            "restarts", "stop_timeout", "data_dir", "data_group", "dataset", "transform",
            "skip_bad_samples", "max_image_pixels", "shuffle", "drop_last")


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
            if item[0] == "epoch_end":
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
    ``skip_bad_samples`` (and ``max_image_pixels``, PIL's limit by default: a larger image is a
    bad sample, 0 no limit). The data group decodes and transforms it; ``images`` come as the
    transform writes them - float32 ``(N, C, H, W)`` after Normalize, uint8 ``(N, H, W, C)``
    without, float16 with ``ToDtype(float16)`` - and ``labels`` are the dataset's targets (int64).
    ``normalize`` applies to Fashion-MNIST only. With a dataset each epoch is cut as torch's
    ``DataLoader`` cuts it: ``shuffle`` (default True) the samples, every batch ``batch_size`` but
    the epoch's last (left out with ``drop_last=True``), batch k the same samples whichever
    instance serves it. ``on_stop``: called when the job is stopping,
    before :class:`Stopped` is raised (save the model and ``state_dict()`` there). ``pin_memory``
    (default: whether CUDA is available) returns page-locked tensors, a copy of each batch.

    It is the script's one stream: make it before anything only the dnn instance should do (on a
    data instance the constructor never returns), and no DataLoader beside it.
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
        if Process.streams:
            raise TypeError("AugmentedBatches: it is a script's only stream, and this process "
                            f"made {Process.streams} already (a troupe.data.DataLoader feeds "
                            "your own Dataset beside others)")
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
        Process.line_buffered()
        settings = dict(options, batch_size=batch_size, epochs=epochs)
        _native.check_settings(settings)
        # Returns on the head only; on a data instance the process serves until the job ends.
        import sys
        _native.start([sys.argv[0] or "python3"] + sys.argv[1:], settings)
        Process.streams = 1
        Process.kinds = ["augmented"]
        Ending.install()
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
        return {"troupe_stream": _native.state(0), "version": 1}

    def load_state_dict(self, state):
        """Resume from what :meth:`state_dict` returned in an earlier run of this job (same batch
        size, seed, epochs and samples). Call it before the first epoch."""
        if not isinstance(state, dict) or "troupe_stream" not in state:
            raise StateError("load_state_dict: not a troupe.data state_dict() (no 'troupe_stream')")
        if self._begun:
            raise RuntimeError("load_state_dict() after the stream started: call it first")
        self._first_epoch = _native.load_state(0, bytes(state["troupe_stream"]),
                                               "the stream's state_dict()")[0]

    def report(self):
        """Every epoch's counts as the trainer kept them (samples, duplicates, missing, rejected
        batches, a digest of the ids): available once every epoch was iterated."""
        return self._report

    # -- internals --
    def _begin(self):
        if not self._begun:
            self._begun = True
            _native.begin(0)

    def _next(self):
        if os.getpid() != self._pid:
            raise RuntimeError("AugmentedBatches cannot be iterated in a forked process (a "
                               "DataLoader worker): use num_workers=0, the batches are made on "
                               "the data group")
        item = next_item(0, self._on_stop, self._normalize)
        if item[0] == "finished":
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


AugmentedBatches.__module__ = Epoch.__module__ = "troupe.data"
