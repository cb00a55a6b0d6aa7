"""troupe.data.DataLoader: torch's DataLoader, its workers moved to the data group
(docs/pytorch.md).

What runs where. The script runs on every instance. A DataLoader made in a cluster is a stream of
the process's troupe job (python/src/job.h): the first one forks the fork server of the data
group's workers (python/troupe/_forkserver.py) and starts the job - on a data instance it never
returns, the process serves its workers' batches until the job ends - and each later one gets
actors of its own, its dataset pickled to the data instances (their scripts never got that far).
Each iter() is a pass: the script's side plans it here with torch's own sampler and generator
(python/troupe/_plan.py), the trainer hands its batches out to the data group's workers and
checks each arrives once. Outside a cluster (plain python3), or with local=True, it is torch's
own DataLoader on this instance, the same batches and the same per-sample seeds."""

import json
import os
import sys
import warnings

from troupe import _forkserver, _local, _workers
from troupe._common import (Ending, JobFailed, Process, StateError, Stopped, _native, _torch,
                            debug_logging, interface_to)
from troupe._plan import Planner, draw_base_seed

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
    ``per_sample_seed``, and AugmentedBatches' ``augmenters_per_node``, ``restarts``,
    ``stop_timeout``, ``data_group`` and ``skip_bad_samples``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=None, collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=2, persistent_workers=False, pin_memory_device="", seed=None,
                 local=False, with_ids=False, on_stop=None, shared_memory_mb=1024,
                 skip_errors=False, in_order=True, per_sample_seed=True, translate=True,
                 **options):
        torch = _torch()
        self._torch = torch
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
                            ("translate", translate)):
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
                            "translate) and "
                            f"{', '.join(_OPTIONS)} (docs/pytorch.md)")
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
        # advice on this machine's worker count is not for the data group's workers.)
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
                prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device)
        spec = self._spec
        self.dataset = dataset
        self.batch_size = spec.batch_size
        self.drop_last = spec.drop_last
        self.generator = generator
        self.collate_fn = spec.collate_fn
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context
        self._seed = seed
        self._own_sampler = sampler is not None or batch_sampler is not None
        self._user_sampler = batch_sampler if batch_sampler is not None else sampler
        self._with_ids = with_ids
        self._on_stop = on_stop
        self._per_sample_seed = per_sample_seed
        self._translate = translate
        self._batch_list = False
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        if pin_memory and not torch.cuda.is_available():
            print("troupe.data: pin_memory=True: no CUDA on this instance; batches are not "
                  "pinned (as torch's DataLoader)", flush=True)
        self._label = None        # set_epoch()'s
        self._passes = 0          # iter()s so far
        self._epochs = 0          # passes so far that were not peeks
        self._live = None         # the pass being iterated: (number, its iterator)
        self._begun = False
        self._resume = None       # load_state_dict(): the pass it continues
        self._stop_group = None   # DDP: the gloo group the ranks agree on a stop in
        self._taken = {}          # batches the script took, by pass
        self._pass_labels = {}    # the script's epoch of each pass
        # Each pass's counts as the trainer kept them, by the script's epoch; peeks apart.
        self.epoch_reports = {}
        self.peeks = []
        self._pid = os.getpid()
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self._planner = Planner(spec, len(dataset) if not iterable else 0, self.batch_size or 1,
                                self.drop_last, self._shuffles(spec), self._own_sampler)
        if self.local:
            if not _workers.in_cluster():
                print(f"troupe.data: not in a troupe cluster: torch's DataLoader with "
                      f"{workers_here} workers on this machine (run under troupe sim or "
                      "SageMaker for the data group)", flush=True)
            self._planner.ranked(self.rank, self.world_size,
                                 seed if seed is not None else 0)
            self.stream = None
            if iterable:
                # An IterableDataset: torch's DataLoader as it is (no indices to plan or seed by).
                if with_ids:
                    raise TypeError("DataLoader: with_ids=True needs a map-style dataset (an "
                                    "IterableDataset's items have no index)")
                self._local_loader = None
                return
            self._local_loader = _local.loader(self, workers_here, pin_memory)
            return
        self._start(dataset, seed, num_workers or 0, prefetch_factor, shared_memory_mb,
                    skip_errors, in_order, options)

    @staticmethod
    def _shuffles(spec):
        torch = _torch()
        return isinstance(spec.sampler, torch.utils.data.RandomSampler)

    # -- the stream --
    def _start(self, dataset, seed, num_workers, prefetch_factor, shared_memory_mb, skip_errors,
               in_order, options):
        from troupe._datasets import ImageDataset
        if Process.kinds and Process.kinds[0] == "augmented":
            raise TypeError("DataLoader: this process streams an AugmentedBatches, which is a "
                            "script's only stream; pass local=True for torch's DataLoader here")
        images = isinstance(dataset, ImageDataset) and not self._per_sample_hooks()
        native = dataset if images else self._translated(dataset)
        # A translated ImageFolder's batches as default_collate makes them: [images, targets].
        self._batch_list = native is not None and not images
        images = native is not None
        settings = dict(options, batch_size=self.batch_size or 1, epochs=0, planned=True,
                        in_order=in_order, train_samples=len(dataset),
                        prefetch_factor=prefetch_factor, shared_memory=shared_memory_mb << 20,
                        augmenters_per_node=options.get("augmenters_per_node", num_workers),
                        shuffle=bool(self._planner.shuffle), drop_last=bool(self.drop_last))
        if images:
            # troupe's own decoding and transforms on the data group (docs/data.md).
            settings.update(dataset=native.path, transform=native.spec, image_seed=native.seed,
                            max_image_pixels=native.max_image_pixels)
        else:
            settings.update(python=True, workers=num_workers)
        spec = _workers.WorkerSpec(dataset, self.collate_fn, self.worker_init_fn,
                                   self.persistent_workers, skip_errors, self._per_sample_seed,
                                   self._spec._auto_collation)
        _native.check_settings(settings)
        Process.line_buffered()
        first = Process.streams == 0
        if first and "TROUPE_LOCAL_FD" in os.environ:
            # A local rank the instance's troupe process started (troupe_procs_per_host): its
            # batches come from that process (no runtime, no workers here).
            Process.local_rank = True
            _native.connect_local(int(os.environ.pop("TROUPE_LOCAL_FD")),
                                  int(os.environ.pop("TROUPE_LOCAL_PARENT")))
            self.stream = 0
            Process.streams, Process.kinds = 1, ["loader"]
            Ending.install()
            self._ranked()
            return
        if first:
            if os.environ.get("TROUPE_CPUS"):
                # troupe sim --pin / --cpus: the instance's CPUs, for its workers too (the
                # runtime pins itself to them only when it starts, after they are forked).
                os.sched_setaffinity(0, _workers.cpu_list(os.environ["TROUPE_CPUS"]))
            # Before the runtime's threads start: every worker is a fork of this one-thread copy.
            fd, _ = _forkserver.start(spec)
            _native.set_fork_server(fd)
            self.stream = 0
            # Returns on the training group's instances (each a DDP rank, the head rank 0); on a
            # data instance the process serves until the job ends.
            _native.start([sys.argv[0] or "python3"] + sys.argv[1:], settings)
            Process.streams, Process.kinds = 1, ["loader"]
            Ending.install()
            placements = _native.placements()
            if placements and debug_logging():
                print(placements, flush=True)
            rank = self._ranked()
            if rank["LOCAL_WORLD_SIZE"] > 1:
                self._start_local_ranks(rank["LOCAL_WORLD_SIZE"])
            return
        # A later loader: its workers' spec reaches the data instances pickled.
        if not images and not Process.local_rank:
            settings["pickled"] = _forkserver.pickled(spec)
        self.stream = _native.add_stream(settings)
        Process.streams += 1
        Process.kinds.append("loader")
        rank = _native.rank()
        self._ranked(rank)

    def _translated(self, dataset):
        """torchvision's ImageFolder with a Compose troupe's pipeline runs: its translation
        (troupe/_translate.py), the data group's C++ pipeline then making its batches; else None
        (Python workers). One line says which, and why."""
        from troupe import _translate
        name = "DataLoader %d" % Process.streams
        try:
            if not self._translate:
                raise _translate.Untranslatable("translate=False")
            if self._per_sample_hooks():
                raise _translate.Untranslatable("a worker_init_fn runs in Python workers")
            if self.collate_fn is not self._torch.utils.data.default_collate:
                raise _translate.Untranslatable("a collate_fn of the script's")
            native = _translate.translate(dataset)
        except _translate.Untranslatable as why:
            if type(dataset).__name__ in ("ImageFolder", "DatasetFolder"):
                print(f"troupe.data: {name}: the dataset's transform runs in Python workers: "
                      f"{why}", flush=True)
            return None
        print(f"troupe.data: {name}: torchvision's {type(dataset).__name__} {native.path} is "
              f"decoded and transformed by the data group's C++ pipeline: {native.spec} "
              "(translate=False: Python workers)", flush=True)
        return native

    def _per_sample_hooks(self):
        """Whether the script hooks the workers (worker_init_fn): then an ImageDataset runs in
        Python workers too, so that the hook runs."""
        return self.worker_init_fn is not None

    def _ranked(self, rank=None):
        """This process's DDP rank, into the environment as torchrun sets it."""
        rank = dict(rank or _native.rank())
        seed = rank.pop("SEED", 0)
        self.rank, self.world_size = rank["RANK"], rank["WORLD_SIZE"]
        self._planner.ranked(self.rank, self.world_size,
                             self._seed_for_shares(seed))
        # torch.distributed.init_process_group() reads them; set for one rank too, as torchrun
        # --nproc_per_node 1 does, so a DDP script runs unchanged on one instance.
        for name, value in rank.items():
            os.environ[name] = str(value)
        # gloo's and NCCL's sockets on the interface that reaches rank 0 (the cluster's private
        # network), not whatever the host name resolves to; a value the job set stays.
        interface = interface_to(str(rank["MASTER_ADDR"])) if self.world_size > 1 else None
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if interface and not os.environ.get(name):
                os.environ[name] = interface
        if self.world_size > 1 and self.stream == 0:
            print(f"troupe.data: DDP rank {self.rank} of {self.world_size}, local rank "
                  f"{rank['LOCAL_RANK']} of {rank['LOCAL_WORLD_SIZE']} (MASTER_ADDR="
                  f"{rank['MASTER_ADDR']} MASTER_PORT={rank['MASTER_PORT']}, collectives on "
                  f"{os.environ.get('GLOO_SOCKET_IFNAME') or 'the default interface'}): "
                  f"{len(self)} batches an epoch", flush=True)
        return rank

    def _seed_for_shares(self, job_seed):
        # The ranks' order of a pass without a sampler of their own: from seed= or, without one,
        # the job's seed, the same on every rank (fresh each run).
        return self._seed if self._seed is not None else job_seed

    def _start_local_ranks(self, count):
        # The instance's other local ranks, as torchrun starts them: this script again, with the
        # same arguments, each fed by its trainers in this process over a socket pair.
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
        if self.local:
            return self._iter_local()
        if os.getpid() != self._pid:
            raise RuntimeError("DataLoader cannot be iterated in a forked process")
        if not self._begun:
            self._begun = True
            _native.begin(self.stream)
        if self._live is not None:
            # The previous pass was left before its end (a break, a peek): what it has not handed
            # over is not made, and counted as abandoned in its report.
            number = self._live
            _native.abandon(self.stream, number)
            self._drain(number)
        number = self._passes
        self._passes += 1
        if self._resume is not None and self._resume[0] == number and self._resume[1]:
            label = self._resume[2]  # the state holds the pass's plan: the trainer resumes it
        else:
            label = self._next_label()
            # torch's order: the base seed first (each iter(), or once with persistent workers),
            # then the sampler's draws.
            if not self.persistent_workers or not hasattr(self, "_base_seed"):
                self._base_seed = draw_base_seed(self.generator)
            ids, ends = self._planner.plan(label)
            _native.begin_pass(self.stream, number, ids, ends, self._base_seed, label)
        self._resume = None
        self._pass_labels[number] = label
        self._taken[number] = 0
        self._live = number
        return _Pass(self, number)

    # -- items --
    def _next(self):
        item = _native.next(self.stream, False, float(self.timeout))
        kind = item[0]
        if kind == "stopped":
            if self._on_stop is not None:
                self._on_stop()
            raise Stopped("SIGTERM or SIGINT on an instance of the job")
        if kind == "timeout":
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds")
        if kind == "failed":
            raise JobFailed(f"troupe.data: {item[2]}")
        return item

    def _drain(self, number):
        while True:
            item = self._next()
            if item[0] == "epoch_end":
                self._record(item)
                if item[1] == number:
                    self._live = None
                    return

    def _record(self, item):
        if not item[2]:
            return
        report = json.loads(item[2])
        number = item[1]
        taken = self._taken.pop(number, 0)
        report["taken"] = taken
        # A peek: the script took at most one batch, then left the pass for another iter().
        peek = report.get("abandoned", 0) > 0 and taken <= 1
        report["peek"] = peek
        if peek:
            self.peeks.append(report)
        else:
            self.epoch_reports[report.get("epoch", number)] = report
            self._epochs += 1

    def _tensors(self, item):
        torch = self._torch
        if isinstance(item[2], list):
            tensors = [torch.from_numpy(a) for a in item[2]]
            structure = json.loads(item[3])
        else:
            # troupe's C++ pipeline (an ImageDataset): (images, targets) as the transform wrote
            tensors = [torch.from_numpy(item[2]), torch.from_numpy(item[3])]
            structure = {"list" if self._batch_list else "tuple": [{"t": 0}, {"t": 1}]}
        if self._pin:
            tensors = [t.pin_memory() for t in tensors]
        batch = _workers.unflatten(structure, tensors)
        if self._with_ids:
            return batch, torch.from_numpy(item[4])
        return batch

    def _agree_stop(self):
        """DDP: the ranks stop at the same step. A rank that stopped alone would leave the others
        waiting in their next collective (an all-reduce of gradients) until the instances are
        killed; so before taking its next item each rank says whether its job is stopping, in an
        all-reduce of one integer, and all stop there if any is. Every rank takes the same number
        of items a pass (the same batches, then the pass's end), so they meet at each."""
        dist = self._torch.distributed
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return  # one process, or ranks that never meet in a collective
        if self.stream != 0:
            # A later loader (validation) may be iterated by some ranks only: each stops at its
            # own next item. The training loader's agreement stops them all at one step.
            return
        if self._stop_group is None:
            # A CPU tensor's all-reduce needs gloo; with NCCL's default group, a gloo group of
            # every rank (made here, at the same item on every rank).
            self._stop_group = (dist.group.WORLD if dist.get_backend() == "gloo"
                                else dist.new_group(backend="gloo"))
        kind, stopping = _native.peek(self.stream)
        flag = self._torch.tensor([1 if stopping or kind == "stopped" else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._stop_group)
        if flag.item():
            # The item it would take next waits untaken: a state_dict() leaves it out, and a
            # resume sends it again.
            if self._on_stop is not None:
                self._on_stop()
            raise Stopped("SIGTERM or SIGINT on an instance of the job (every DDP rank stops "
                          "at this step)")

    # -- state --
    def handoffs(self):
        """What handing batches over has cost so far on the trainer's side: ``{"batches": n,
        "us_per_batch": t}``, from asking for a batch that was already queued to holding it as
        tensors (waits for data are not in it). Zero batches when local."""
        if self.local:
            return {"batches": 0, "us_per_batch": 0.0}
        count, seconds = _native.handoffs(self.stream)
        return {"batches": count, "us_per_batch": 1e6 * seconds / count if count else 0.0}

    def state_dict(self):
        """The loader's position: the pass in progress as planned and each shard's acknowledged
        position in it. The batch received last counts as trained."""
        if self.local:
            raise RuntimeError("state_dict(): a local DataLoader (torch's) has no state")
        return {"troupe_stream": _native.state(self.stream), "version": 2}

    def load_state_dict(self, state):
        """Resume from what :meth:`state_dict` returned in an earlier run of this job; call it
        before the first ``iter()``."""
        if not isinstance(state, dict) or "troupe_stream" not in state:
            raise StateError("load_state_dict: not a troupe.data state_dict() (no 'troupe_stream')")
        if self._begun:
            raise RuntimeError("load_state_dict() after the first iter(): call it first")
        if self.local:
            raise RuntimeError("load_state_dict(): a local DataLoader (torch's) has no state")
        number, planned, label = _native.load_state(self.stream, bytes(state["troupe_stream"]),
                                                    "the loader's state_dict()")
        self._passes = self._epochs = number
        self._resume = (number, planned, label)

    # -- local: torch's DataLoader on this instance --
    def _iter_local(self):
        if self._local_loader is None:
            return iter(self._spec)
        return _local.start_pass(self, self._local_loader)


class _Pass:
    """One pass of a cluster DataLoader: its batches, then StopIteration."""

    def __init__(self, loader, number):
        self._loader = loader
        self._number = number
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        loader = self._loader
        while True:
            if self._done:
                raise StopIteration
            if loader._live != self._number:
                # A newer iter() started the next pass and left this one: one live iterator at a
                # time, as the batches of one stream go to one of them.
                mine = loader._pass_labels.get(self._number, self._number)
                newest = loader._pass_labels.get(loader._passes - 1, loader._passes - 1)
                raise RuntimeError(f"DataLoader: this iterator's epoch {mine} was left when "
                                   f"iter(loader) started epoch {newest}: two live iterators; "
                                   "take batches from the newest one only")
            loader._agree_stop()
            item = loader._next()
            if item[0] == "epoch_end":
                loader._record(item)
                if item[1] == self._number:
                    loader._live = None
                    self._done = True
                    raise StopIteration
                continue
            if item[1] != self._number:
                continue
            loader._taken[self._number] = loader._taken.get(self._number, 0) + 1
            return loader._tensors(item)

    def __len__(self):
        return len(self._loader)


DataLoader.__module__ = "troupe.data"
