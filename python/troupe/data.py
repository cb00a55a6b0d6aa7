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

__all__ = ["AugmentedBatches", "DataLoader", "Stopped", "JobFailed", "StateError",
           "ImageDataset"]


from troupe._common import JobFailed, StateError, Stopped, _native, _torch, numpy  # noqa: F401
from troupe._datasets import FashionMNIST, ImageDataset, fashion_mnist, normalize  # noqa: F401
from troupe._workers import _cpu_list, _in_cluster, _read_exact, _unflatten, _worker_main

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


# -- troupe.data.DataLoader: a script's own Dataset on the data group --------------------------

class _RankShare:
    """``DataLoader.sampler``: what a DDP script asks of a DistributedSampler."""

    def __init__(self, loader):
        self._loader = loader

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    def __len__(self):
        loader = self._loader
        _, used, _ = _native.epoch_order(len(loader.dataset), 0, 0, False, loader.batch_size,
                                         loader.drop_last, loader.rank, loader.world_size)
        return used


class DataLoader:
    """torch's ``DataLoader``, its workers moved to the data group (docs/pytorch.md)::

        loader = troupe.data.DataLoader(dataset, batch_size=64, shuffle=True)
        for epoch in range(10):
            for images, labels in loader:
                ...

    ``dataset`` is any map-style dataset (``__len__`` and ``__getitem__``), built by the script
    on every instance (nothing is pickled). On each data instance ``num_workers`` worker
    processes (default: one per CPU the process may use) compute ``dataset[i]`` for the indices
    of their shard and ``collate_fn`` (default: torch's ``default_collate``) of them; the tensors
    go to the node through shared memory and to the trainer over troupe's stream as dtype, shape
    and bytes. Each ``iter(loader)`` is the next epoch: every batch ``batch_size`` samples but
    its last (left out with ``drop_last``); with ``shuffle`` the samples of batch k are fixed by
    ``seed`` (default 42) and the epoch, whichever worker or instance makes it. Every sample
    once per epoch, through lost and drained data instances (docs/hetero_train.md). An exception
    in ``__getitem__`` fails the job naming the index, with the worker's traceback; with
    ``skip_errors=True`` the sample is left out of its batch, counted as skipped and listed in
    the report's ``skipped_files`` instead.

    ``in_order=True`` hands the batches over in the epoch's order (shards of one batch: a batch
    made early waits for those before it). A ``break`` leaves the epoch: its remaining batches are
    not trained on and counted as ``abandoned`` in ``epoch_reports``; an older iterator used after
    a newer ``iter()`` raises RuntimeError.

    DDP: on a training group of several instances, or with ``TROUPE_PROCS_PER_HOST`` processes an
    instance (default: one per GPU), each process is a rank; the loader sets MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE as torchrun does (make it before
    ``init_process_group()``) and gives each rank a disjoint share of every epoch, the same
    number of batches on each (``len(loader)``).

    A :class:`ImageDataset` takes troupe's C++ decoding and transforms on the data group instead
    of Python workers. Outside a troupe cluster (plain ``python3 train.py``) it is torch's own
    DataLoader with ``num_workers`` workers on this machine, and says so in one line.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, collate_fn=None,
                 seed=None, *, num_workers=None, with_ids=False, pin_memory=None, on_stop=None,
                 shared_memory_mb=256, skip_errors=False, in_order=False, **options):
        torch = _torch()
        for name, value in (("batch_size", batch_size), ("num_workers", num_workers),
                            ("seed", seed), ("shared_memory_mb", shared_memory_mb)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"DataLoader: {name}={value!r}: an int, as torch's DataLoader "
                                f"takes (not {type(value).__name__})")
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size={batch_size}: at least 1")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"DataLoader: num_workers={num_workers}: at least 1 (the workers "
                             "run on the data group)")
        if shared_memory_mb < 1:
            raise ValueError(f"DataLoader: shared_memory_mb={shared_memory_mb}: at least 1")
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last),
                            ("skip_errors", skip_errors), ("in_order", in_order)):
            if not isinstance(value, bool):
                raise TypeError(f"DataLoader: {name}={value!r}: True or False")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn={collate_fn!r} is not callable")
        unknown = sorted(set(options) - {"prefetch", "augmenters_per_node", "restarts",
                                         "stop_timeout", "data_group", "skip_bad_samples"})
        if unknown:
            raise TypeError(f"DataLoader: unknown option(s) {', '.join(unknown)}")
        try:
            length = len(dataset)
        except TypeError as e:
            raise TypeError("DataLoader: the dataset has no len(): troupe's DataLoader takes "
                            "map-style datasets (__len__ and __getitem__)") from e
        if length < 1:
            raise ValueError("DataLoader: the dataset is empty")
        if drop_last and length < batch_size:
            raise ValueError(f"DataLoader: drop_last with {length} samples and batch_size "
                             f"{batch_size} leaves no batch")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self.seed = 42 if seed is None else seed
        self._with_ids = with_ids
        self._on_stop = on_stop
        self._torch = torch
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._epoch = 0
        self._live = None
        self._begun = False
        self._stop_group = None  # DDP: the gloo group the ranks agree on a stop in (_agree_stop)
        self._report = None
        # Each finished epoch's counts as the trainer kept them (samples, duplicates, missing,
        # skipped, and every file or index skipped so far), by epoch.
        self.epoch_reports = {}
        self._pid = os.getpid()
        if _in_cluster() and os.environ.get("TROUPE_CPUS"):
            # troupe sim --pin / --cpus: the instance's CPUs, for its workers too (the runtime
            # pins itself to them only when it starts, after they are forked).
            os.sched_setaffinity(0, _cpu_list(os.environ["TROUPE_CPUS"]))
        workers = num_workers or len(os.sched_getaffinity(0))
        collate = collate_fn or torch.utils.data.default_collate
        # This process's DDP rank: troupe's (below) in a cluster; outside one torchrun's, if any.
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        if not _in_cluster():
            # Plain python3: torch's own DataLoader on this machine, for developing the script,
            # with the same batches as on the data group.
            print(f"troupe.data: not in a troupe cluster: torch's DataLoader with {workers} "
                  "workers on this machine (run under troupe sim or SageMaker for the data group)",
                  flush=True)
            self._local = (collate, workers)
            return
        self._local = None
        self._images = isinstance(dataset, ImageDataset)
        if "TROUPE_LOCAL_FD" in os.environ:
            # A local rank the instance's troupe process started (troupe_procs_per_host): its
            # batches come from that process, as tensors (no runtime, no workers here).
            self._images = False
            _native.connect_local(int(os.environ.pop("TROUPE_LOCAL_FD")),
                                  int(os.environ.pop("TROUPE_LOCAL_PARENT")))
            _Ending.install()
            self._ranked()
            return
        settings = dict(options, batch_size=batch_size, epochs=0, seed=self.seed,
                        in_order=in_order)
        if self._images:
            # troupe's own decoding and transforms on the data group (docs/data.md).
            settings.update(dataset=dataset.path, transform=dataset.spec, shuffle=shuffle,
                            drop_last=drop_last)
        else:
            settings.update(python=True, train_samples=length, shuffle=shuffle,
                            drop_last=drop_last)
            self._fork_workers(workers, collate, shared_memory_mb << 20, skip_errors)
        sys.stdout.flush()
        sys.stderr.flush()
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)
        # Returns on the training group's instances (each a DDP rank, the head rank 0); on a data
        # instance the process serves until the job ends.
        _native.start([sys.argv[0] or "python3"] + sys.argv[1:], settings)
        _Ending.install()
        placements = _native.placements()
        if placements:
            print(placements, flush=True)
        rank = self._ranked()
        if rank["LOCAL_WORLD_SIZE"] > 1:
            self._start_local_ranks(rank["LOCAL_WORLD_SIZE"])

    def _ranked(self):
        """This process's DDP rank, into the environment as torchrun sets it."""
        rank = _native.rank()
        self.rank, self.world_size = rank["RANK"], rank["WORLD_SIZE"]
        # torch.distributed.init_process_group() reads them; set for one rank too, as torchrun
        # --nproc_per_node 1 does, so a DDP script runs unchanged on one instance.
        for name, value in rank.items():
            os.environ[name] = str(value)
        if self.world_size > 1:
            print(f"troupe.data: DDP rank {self.rank} of {self.world_size}, local rank "
                  f"{rank['LOCAL_RANK']} of {rank['LOCAL_WORLD_SIZE']} (MASTER_ADDR="
                  f"{rank['MASTER_ADDR']} MASTER_PORT={rank['MASTER_PORT']}): {len(self)} "
                  "batches an epoch", flush=True)
        return rank

    def _start_local_ranks(self, count):
        # The instance's other local ranks, as torchrun starts them: this script again, with the
        # same arguments, each fed by its trainer in this process over a socket pair.
        import socket
        import subprocess
        original = getattr(sys, "orig_argv", [sys.executable] + sys.argv)
        command = [sys.executable] + list(original[1:])
        self._local_ranks = []
        for k in range(1, count):
            mine, theirs = socket.socketpair()
            env = dict(os.environ, TROUPE_LOCAL_FD=str(theirs.fileno()),
                       TROUPE_LOCAL_PARENT=str(os.getpid()))
            for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                env.pop(name, None)
            child = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),))
            theirs.close()
            _native.serve_local(k, mine.detach(), child.pid)
            self._local_ranks.append(child)

    def _fork_workers(self, count, collate, size, skip_errors):
        # Before the runtime's threads start, as torch forks its workers: each gets a request
        # and a reply pipe and a memfd for its tensors.
        fds = []
        for k in range(count):
            request_r, request_w = os.pipe()
            reply_r, reply_w = os.pipe()
            memory = os.memfd_create(f"troupe-dataloader-{k}")
            os.ftruncate(memory, size)
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(request_w)
                    os.close(reply_r)
                    for other in fds:
                        for fd in other[1:4]:
                            os.close(fd)
                    _worker_main(self.dataset, collate, request_r, reply_w, memory, size,
                                 skip_errors)
                finally:
                    os._exit(1)
            os.close(request_r)
            os.close(reply_w)
            fds.append((pid, request_w, reply_r, memory, size))
        _native.set_workers(fds)

    def __len__(self):
        """Batches per epoch; of a DDP rank, its share (every rank the same number)."""
        if getattr(self, "_length", None) is None:
            _, used, _ = _native.epoch_order(len(self.dataset), 0, 0, False, self.batch_size,
                                             self.drop_last, self.rank, self.world_size)
            self._length = (used + self.batch_size - 1) // self.batch_size
        return self._length

    @property
    def sampler(self):
        """For code written for DistributedSampler: ``loader.sampler.set_epoch(epoch)`` is
        :meth:`set_epoch`, ``len(loader.sampler)`` this rank's samples an epoch."""
        return _RankShare(self)

    def set_epoch(self, epoch):
        """For code written for DistributedSampler: the next ``iter()`` must be epoch ``epoch``
        (epochs come in order here; another number is a ValueError naming the next one)."""
        if self._local is None and int(epoch) != self._epoch:
            raise ValueError(f"DataLoader.set_epoch({epoch}): the next epoch is {self._epoch}; "
                             "troupe's epochs come in order")

    def _batches(self, epoch):
        """Epoch ``epoch``'s batches of sample ids, as the data group cuts them."""
        order, used, _ = _native.epoch_order(len(self.dataset), self.seed, epoch, self.shuffle,
                                             self.batch_size, self.drop_last, self.rank,
                                             self.world_size)
        order = order.tolist()
        return [order[k:min(k + self.batch_size, used)] for k in range(0, used, self.batch_size)]

    def _iter_local(self):
        collate, workers = self._local
        batches = self._batches(self._epoch)
        self._epoch += 1
        loader = self._torch.utils.data.DataLoader(self.dataset, batch_sampler=batches,
                                                   collate_fn=collate, num_workers=workers)
        for ids, batch in zip(batches, loader):
            yield (batch, self._torch.tensor(ids)) if self._with_ids else batch

    def __iter__(self):
        if self._local is not None:
            yield from self._iter_local()
            return
        if os.getpid() != self._pid:
            raise RuntimeError("DataLoader cannot be iterated in a forked process")
        if not self._begun:
            self._begun = True
            _native.begin()
        if self._live is not None:
            # The previous epoch was left before its end (a break): its remaining batches are
            # not trained on (counted as abandoned in its report) and never reach the next epoch.
            _native.abandon(self._live)
            self._drain(self._live)
        epoch = self._epoch
        self._epoch += 1
        self._live = epoch
        while True:
            if self._live != epoch:
                # A newer iter() started the next epoch and left this one: one live iterator at a
                # time, as the batches of one stream go to one of them.
                raise RuntimeError(f"DataLoader: this iterator's epoch {epoch} was left when "
                                   f"iter(loader) started epoch {self._epoch - 1}: two live "
                                   "iterators; take batches from the newest one only")
            self._agree_stop()
            item = self._next()
            if item[0] == "epoch_end":
                self._record(item)
                if item[1] == epoch:
                    self._live = None
                    return
                continue
            if item[1] != epoch:
                continue
            if self._images:
                # troupe's C++ pipeline: (images, targets) as the transform wrote them.
                tensors = [self._torch.from_numpy(item[2]), self._torch.from_numpy(item[3])]
                structure = {"tuple": [{"t": 0}, {"t": 1}]}
            else:
                import json
                tensors = [self._torch.from_numpy(a) for a in item[2]]
                structure = json.loads(item[3])
            if self._pin:
                tensors = [t.pin_memory() for t in tensors]
            batch = _unflatten(structure, tensors)
            if self._with_ids:
                yield batch, self._torch.from_numpy(item[4])
            else:
                yield batch

    def _agree_stop(self):
        """DDP: the ranks stop at the same step. A rank that stopped alone would leave the others
        waiting in their next collective (an all-reduce of gradients) until the instances are
        killed; so before taking its next item each rank says whether its job is stopping, in an
        all-reduce of one integer, and all stop there if any is. Every rank takes the same number
        of items an epoch (the same batches, then the epoch's end), so they meet at each."""
        dist = self._torch.distributed
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return  # one process, or ranks that never meet in a collective
        if self._stop_group is None:
            # A CPU tensor's all-reduce needs gloo; with NCCL's default group, a gloo group of
            # every rank (made here, at the same item on every rank).
            self._stop_group = (dist.group.WORLD if dist.get_backend() == "gloo"
                                else dist.new_group(backend="gloo"))
        kind, stopping = _native.peek()
        flag = self._torch.tensor([1 if stopping or kind == "stopped" else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._stop_group)
        if flag.item():
            # The item it would take next waits untaken: a state_dict() leaves it out, and a
            # resume sends it again.
            if self._on_stop is not None:
                self._on_stop()
            raise Stopped("SIGTERM or SIGINT on an instance of the job (every DDP rank stops "
                          "at this step)")

    def _drain(self, epoch):
        while True:
            item = self._next()
            if item[0] == "epoch_end":
                self._record(item)
                if item[1] == epoch:
                    self._live = None
                    return

    def _record(self, item):
        if item[2]:
            import json
            self.epoch_reports[item[1]] = json.loads(item[2])

    def _next(self):
        item = _native.next(False)
        kind = item[0]
        if kind == "stopped":
            if self._on_stop is not None:
                self._on_stop()
            raise Stopped("SIGTERM or SIGINT on an instance of the job")
        if kind == "failed":
            raise JobFailed(f"troupe.data: {item[2]}")
        return item

    def handoffs(self):
        """What handing batches over has cost so far on the trainer's side: ``{"batches": n,
        "us_per_batch": t}``, from asking for a batch that was already queued to holding it as
        tensors (waits for data are not in it). Zero batches outside a cluster."""
        if self._local is not None:
            return {"batches": 0, "us_per_batch": 0.0}
        count, seconds = _native.handoffs()
        return {"batches": count, "us_per_batch": 1e6 * seconds / count if count else 0.0}

    def state_dict(self):
        """The loader's position: each shard's acknowledged position in the epoch in progress.
        The batch received last counts as trained."""
        return {"troupe_stream": _native.state(), "version": 1}

    def load_state_dict(self, state):
        """Resume from what :meth:`state_dict` returned in an earlier run of this job; call it
        before the first ``iter()``."""
        if not isinstance(state, dict) or "troupe_stream" not in state:
            raise StateError("load_state_dict: not a troupe.data state_dict() (no 'troupe_stream')")
        if self._begun:
            raise RuntimeError("load_state_dict() after the first iter(): call it first")
        self._epoch = _native.load_state(bytes(state["troupe_stream"]), "the loader's state_dict()")
