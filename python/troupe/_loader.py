"""troupe.data.DataLoader: torch's DataLoader, its workers moved to the data group
(docs/pytorch.md). This file is its front: it takes torch's arguments as torch does, keeps what
every way of running shares (torch's own DataLoader made from the arguments, the passes' plan,
the script's epoch, the DDP rank) and hands each iter() and the state to the one way it runs.

The ways. The script runs on every instance. A DataLoader made in a cluster is a stream of the
process's troupe job (python/troupe/_cluster.py, started by python/troupe/_job.py): the first
one starts the job - on a data instance it never returns, the process serves its workers'
batches until the job ends - and each later one gets actors of its own. Outside a cluster
(plain python3), or with local=True, it is torch's own DataLoader on this instance, the same
batches and the same per-sample seeds (python/troupe/_local.py)."""

import os
import warnings

from troupe import _cluster, _local, _workers
from troupe._common import StateError, _native, _torch
from troupe._plan import Planner

# troupe's own options of AugmentedBatches' that a DataLoader takes too.
_OPTIONS = ("augmenters_per_node", "restarts", "stop_timeout", "data_group", "skip_bad_samples")


class _Sampler:
    """``DataLoader.sampler`` when the script gave none: torch's default sampler, answering
    ``set_epoch()`` and ``len()`` as DistributedSampler does for code written for it."""

    def __init__(self, loader, sampler):
        self._loader = loader
        self._sampler = sampler

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    def __len__(self):
        loader = self._loader
        if loader._planner.shared:
            import numpy
            return len(_native.rank_share(numpy.arange(len(loader.dataset), dtype=numpy.uint32),
                                          loader.batch_size, loader.drop_last, loader.rank,
                                          loader.world_size))
        return len(self._sampler)

    def __iter__(self):
        return iter(self._sampler)


class DataLoader:
    """torch's ``DataLoader``, its workers on the data group (docs/pytorch.md)::

        loader = troupe.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)
        for epoch in range(10):
            for images, labels in loader:
                ...

    torch's arguments mean what they mean in torch: each ``iter(loader)`` is a pass of the
    ``sampler`` or ``batch_sampler`` (default: torch's, from ``shuffle``, ``batch_size``,
    ``drop_last`` and ``generator``), its base seed drawn from ``generator`` as torch draws it;
    ``num_workers`` worker processes on each data instance (default: the instance's vCPUs, its
    CPU share under troupe sim) compute ``dataset[i]`` and ``collate_fn``, each with
    ``prefetch_factor`` batches in the making, seeded ``base_seed + worker id`` (distinct on every
    instance), ``worker_init_fn`` and ``get_worker_info()`` as in torch's workers. Beyond torch,
    each item's random draws (torch, random, numpy) are seeded from (base seed, its position in the
    pass) - the same whichever worker or instance makes it - unless ``per_sample_seed=False``.
    The table in docs/pytorch.md says what each argument does here.

    troupe's own: ``seed`` (a generator seeded with it), ``local`` (torch's DataLoader on this
    instance), ``with_ids``, ``on_stop``, ``shared_memory_mb``, ``skip_errors``, ``in_order``,
    ``per_sample_seed``, ``translate`` and ``decode_scaling`` (a translated ImageFolder's JPEGs
    decoded at a DCT scale: faster, other pixels than torchvision's), and AugmentedBatches' ``augmenters_per_node``, ``restarts``,
    ``stop_timeout``, ``data_group`` and ``skip_bad_samples``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=None, collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="", seed=None,
                 local=False, with_ids=False, on_stop=None, shared_memory_mb=1024,
                 skip_errors=False, in_order=True, per_sample_seed=True, translate=True,
                 decode_scaling=False, **options):
        torch = _torch()
        self._torch = torch
        _check_arguments(batch_size, num_workers, collate_fn, timeout, worker_init_fn, seed,
                         local, with_ids, shared_memory_mb, skip_errors, in_order,
                         per_sample_seed, translate, decode_scaling, options)
        if seed is not None:
            if generator is not None:
                raise ValueError("DataLoader: seed= and generator= both given: seed=S is "
                                 "generator=torch.Generator().manual_seed(S); give one")
            generator = torch.Generator()
            generator.manual_seed(seed)
        try:
            len(dataset)
            iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        except TypeError:
            iterable = True
        self.local = local or not _workers.in_cluster()
        if iterable and not self.local:
            raise TypeError(
                "DataLoader: the dataset has no len() or is an IterableDataset: the data group "
                "makes items by index, so troupe's DataLoader takes map-style datasets (__len__ "
                "and __getitem__); pass local=True for torch's DataLoader on this instance")
        self.num_workers = num_workers
        # Workers here (local, or the check below): as given; else this machine's CPUs, or
        # torch's default (0) for an IterableDataset, whose every worker would yield all of it.
        workers_here = (num_workers if num_workers is not None else
                        0 if iterable else len(os.sched_getaffinity(0)))
        # torch's own DataLoader, built from the same arguments: it checks them with torch's
        # messages and makes the default sampler and collate_fn; passes are planned with it. (Its
        # advice on this machine's worker count is not for the data group's workers.) What the
        # script left out stays out: torch 1.13's prefetch_factor defaults to 2, torch 2's to None.
        given = {"prefetch_factor": prefetch_factor} if prefetch_factor is not None else {}
        with warnings.catch_warnings():
            if not self.local:
                warnings.simplefilter("ignore", UserWarning)
            self._spec = torch.utils.data.DataLoader(
                dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=workers_here if self.local else max(workers_here, 1),
                collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                timeout=timeout, worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context, generator=generator,
                persistent_workers=persistent_workers, pin_memory_device=pin_memory_device,
                **given)
        spec = self._spec
        self.dataset = dataset
        self.batch_size = spec.batch_size
        self.drop_last = spec.drop_last
        self.generator = generator
        self.collate_fn = spec.collate_fn
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self._prefetch_given = prefetch_factor
        self.in_order = in_order
        self.persistent_workers = persistent_workers
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context
        self._seed = seed
        self._own_sampler = sampler is not None or batch_sampler is not None
        self._user_sampler = batch_sampler if batch_sampler is not None else sampler
        self._with_ids = with_ids
        self._on_stop = on_stop
        self._per_sample_seed = per_sample_seed
        self._skip_errors = skip_errors
        self._translate = translate
        self._decode_scaling = decode_scaling
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        if pin_memory and not torch.cuda.is_available():
            print("troupe.data: pin_memory=True: no CUDA on this instance; batches are not "
                  "pinned (as torch's DataLoader)", flush=True)
        self._label = None        # set_epoch()'s
        self._passes = 0          # iter()s so far
        self._epochs = 0          # passes so far that were not peeks
        # Each pass's counts as the trainer kept them, by the script's epoch; peeks apart.
        self.epoch_reports = {}
        self.peeks = []
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self._planner = Planner(spec, len(dataset) if not iterable else 0, self.batch_size or 1,
                                self.drop_last, self._shuffles(spec), self._own_sampler, seed,
                                generator)
        self._way = self._way_to_run(iterable, workers_here, pin_memory, num_workers,
                                     shared_memory_mb, skip_errors, in_order, options, local)

    def _way_to_run(self, iterable, workers_here, pin_memory, num_workers, shared_memory_mb,
                    skip_errors, in_order, options, asked_local):
        """The one way this loader runs: torch's DataLoader on this instance (plain python3, or
        local=True), else a stream of the process's troupe job."""
        if self.local:
            return _local.LocalLoader(self, iterable, workers_here, pin_memory, asked_local)
        return _cluster.ClusterLoader(self, num_workers or 0, shared_memory_mb, skip_errors,
                                      in_order, options)

    @staticmethod
    def _shuffles(spec):
        torch = _torch()
        return isinstance(spec.sampler, torch.utils.data.RandomSampler)

    # -- torch's interface --
    def __len__(self):
        """Batches per pass (of a DDP rank, its share), as torch's len(DataLoader)."""
        return len(self._planner)

    @property
    def sampler(self):
        """The sampler (torch's default one answering ``set_epoch()`` and ``len()``, for code
        written for DistributedSampler, when the script gave none)."""
        return self._spec.sampler if self._own_sampler else _Sampler(self, self._spec.sampler)

    @property
    def batch_sampler(self):
        return self._spec.batch_sampler

    @property
    def stream(self):
        """The loader's stream in the process's troupe job (0 for the first), None when local."""
        return self._way.stream

    def set_epoch(self, epoch):
        """The epoch the next ``iter()`` is (its reports are filed under it; a dataset's or the
        sampler's own ``set_epoch()`` hears it too)."""
        self._label = int(epoch)
        if self._own_sampler and hasattr(self._user_sampler, "set_epoch"):
            self._user_sampler.set_epoch(epoch)

    def _next_label(self):
        """The script's epoch of the pass starting now: set_epoch()'s, else the sampler's own
        (DistributedSampler's set_epoch()), else the passes so far that were not peeks."""
        if self._label is not None:
            return self._label
        sampler_epoch = getattr(self._user_sampler, "epoch",
                                getattr(getattr(self._user_sampler, "sampler", None), "epoch",
                                        None))
        if isinstance(sampler_epoch, int) and not isinstance(sampler_epoch, bool):
            return sampler_epoch
        return self._epochs

    def __iter__(self):
        return iter(self._way)

    # -- state --
    def handoffs(self):
        """What handing batches over has cost so far on the trainer's side: ``{"batches": n,
        "us_per_batch": t}``, from asking for a batch that was already queued to holding it as
        tensors (waits for data are not in it). Zero batches when local."""
        return self._way.handoffs()

    def state_dict(self):
        """The loader's position: the pass in progress as planned and each shard's acknowledged
        position in it. The batch received last counts as trained."""
        return self._way.state_dict()

    def load_state_dict(self, state):
        """Resume from what :meth:`state_dict` returned in an earlier run of this job; call it
        before the first ``iter()``."""
        if not isinstance(state, dict) or "troupe_stream" not in state:
            raise StateError("load_state_dict: not a troupe.data state_dict() (no 'troupe_stream')")
        self._way.load_state_dict(state)


def _check_arguments(batch_size, num_workers, collate_fn, timeout, worker_init_fn, seed, local,
                     with_ids, shared_memory_mb, skip_errors, in_order, per_sample_seed,
                     translate, decode_scaling, options):
    """The arguments' types and ranges, each refusal naming the argument, its value and what it
    takes (torch's DataLoader checks the rest, with its own messages)."""
    for name, value in (("num_workers", num_workers), ("seed", seed),
                        ("shared_memory_mb", shared_memory_mb)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"DataLoader: {name}={value!r}: an int, as torch's DataLoader "
                            f"takes (not {type(value).__name__})")
    if batch_size is not None and (not isinstance(batch_size, int) or
                                   isinstance(batch_size, bool)):
        raise TypeError(f"DataLoader: batch_size={batch_size!r}: an int or None, as torch's "
                        f"DataLoader takes (not {type(batch_size).__name__})")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"DataLoader: batch_size={batch_size}: at least 1")
    if num_workers is not None and num_workers < 0:
        raise ValueError(f"DataLoader: num_workers={num_workers}: 0 or more")
    if shared_memory_mb < 1:
        raise ValueError(f"DataLoader: shared_memory_mb={shared_memory_mb}: at least 1")
    for name, value in (("local", local), ("with_ids", with_ids), ("skip_errors", skip_errors),
                        ("in_order", in_order), ("per_sample_seed", per_sample_seed),
                        ("translate", translate), ("decode_scaling", decode_scaling)):
        if not isinstance(value, bool):
            raise TypeError(f"DataLoader: {name}={value!r}: True or False")
    for name, value in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"DataLoader: {name}={value!r} is not callable")
    if not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"DataLoader: timeout={timeout!r}: seconds, 0 or more (as torch's)")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"DataLoader: unknown argument(s) {', '.join(unknown)}: torch's "
                        "DataLoader arguments, troupe's (seed, local, with_ids, on_stop, "
                        "shared_memory_mb, skip_errors, in_order, per_sample_seed, "
                        "translate, decode_scaling) and "
                        f"{', '.join(_OPTIONS)} (docs/pytorch.md)")


DataLoader.__module__ = "troupe.data"
