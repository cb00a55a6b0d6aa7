"""How a troupe.data.DataLoader made in a cluster becomes a stream of the process's troupe job
(troupe/train/script_job.h): the settings of its batch source - a troupe.data.ImageDataset, or
torchvision's ImageFolder translated (python/troupe/_translate.py), decoded and transformed by the
data group's C++ pipeline; else the script's Dataset in Python workers (python/troupe/_workers.py)
- then one of three starts, and this process's DDP rank, into the environment as torchrun sets it.

The starts. A local rank's process (troupe_procs_per_host) connects to its instance's troupe
process, which feeds it. The process's first stream forks the fork server of the data group's
workers (python/troupe/_forkserver.py) and starts the job - on a data instance it never returns,
the process serves its workers' batches until the job ends - and the instance's other local
ranks. Each later one gets actors of its own, its workers' spec pickled to the data instances
(their scripts never got that far)."""

import os
import sys

from troupe import _ddp, _forkserver, _workers
from troupe._common import Ending, Process, _native, debug_logging, interface_to


def join(loader, num_workers, shared_memory_mb, skip_errors, in_order, options):
    """Starts `loader`'s stream (`loader` a troupe.data.DataLoader in a cluster, its rank set
    here); returns (the stream's number, the structure of its batches where troupe's C++ pipeline
    makes them - "list" for a translated ImageFolder's, as default_collate makes them, "tuple"
    for an ImageDataset's - or None: the workers' own)."""
    from troupe._datasets import ImageDataset
    if Process.kinds and Process.kinds[0] == "augmented":
        raise TypeError("DataLoader: this process streams an AugmentedBatches, which is a "
                        "script's only stream; pass local=True for torch's DataLoader here")
    dataset = loader.dataset
    images = isinstance(dataset, ImageDataset) and not _per_sample_hooks(loader)
    images_given = images
    native = dataset if images else _translated(loader)
    # A translated ImageFolder's batches as default_collate makes them: [images, targets].
    made_as = None if native is None else "tuple" if images else "list"
    images = native is not None
    settings = dict(options, batch_size=loader.batch_size or 1, epochs=0, planned=True,
                    in_order=in_order, train_samples=len(dataset),
                    prefetch_factor=loader.prefetch_factor,
                    shared_memory=shared_memory_mb << 20,
                    augmenters_per_node=options.get("augmenters_per_node", num_workers),
                    shuffle=bool(loader._planner.shuffle), drop_last=bool(loader.drop_last))
    if images:
        # troupe's own decoding and transforms on the data group (docs/data.md); skip_errors
        # leaves out what cannot be read there too.
        settings.update(dataset=native.path, transform=native.spec, image_seed=native.seed,
                        max_image_pixels=native.max_image_pixels)
        if not images_given:
            # A translated ImageFolder: its class folders, whatever lies beside them; JPEGs at
            # full size (torchvision's pixels) unless the script asked for DCT scaling.
            settings.update(image_folder=True, decode_scaling=bool(loader._decode_scaling))
        if skip_errors:
            settings["skip_bad_samples"] = True
    else:
        settings.update(python=True, workers=num_workers)
    spec = _workers.WorkerSpec(dataset, loader.collate_fn, loader.worker_init_fn,
                               loader.persistent_workers, skip_errors, loader._per_sample_seed,
                               loader._spec._auto_collation)
    _native.check_settings(settings)
    Process.line_buffered()
    first = Process.streams == 0
    if first and "TROUPE_LOCAL_FD" in os.environ:
        stream = _connect_local_rank(loader)
    elif first:
        stream = _start_job(loader, spec, settings)
    else:
        stream = _add_stream(loader, spec, settings, images)
    return stream, made_as


def _connect_local_rank(loader):
    """A local rank the instance's troupe process started (troupe_procs_per_host): its
    batches come from that process (no runtime, no workers here). Stream 0."""
    Process.local_rank = True
    _native.connect_local(int(os.environ.pop("TROUPE_LOCAL_FD")),
                          int(os.environ.pop("TROUPE_LOCAL_PARENT")))
    Process.streams, Process.kinds = 1, ["loader"]
    Ending.install()
    _ranked(loader, 0)
    return 0


def _start_job(loader, spec, settings):
    """The process's first stream: the fork server, the job, the instance's other local ranks.
    Stream 0."""
    if os.environ.get("TROUPE_CPUS"):
        # troupe sim --pin / --cpus: the instance's CPUs, for its workers too (the
        # runtime pins itself to them only when it starts, after they are forked).
        os.sched_setaffinity(0, _workers.cpu_list(os.environ["TROUPE_CPUS"]))
    # Before the runtime's threads start: every worker is a fork of this one-thread copy.
    fd, _ = _forkserver.start(spec)
    _native.set_fork_server(fd)
    # Returns on the training group's instances (each a DDP rank, the head rank 0); on a
    # data instance the process serves until the job ends.
    _native.start([sys.argv[0] or "python3"] + sys.argv[1:], settings)
    Process.streams, Process.kinds = 1, ["loader"]
    Ending.install()
    placements = _native.placements()
    if placements and debug_logging():
        print(placements, flush=True)
    rank = _ranked(loader, 0)
    if rank["LOCAL_WORLD_SIZE"] > 1:
        _start_local_ranks(rank["LOCAL_WORLD_SIZE"])
    return 0


def _add_stream(loader, spec, settings, images):
    """A later loader: its workers' spec reaches the data instances pickled. Its stream's
    number."""
    if not images and not Process.local_rank:
        settings["pickled"] = _forkserver.pickled(spec)
    stream = _native.add_stream(settings)
    Process.streams += 1
    Process.kinds.append("loader")
    _ranked(loader, stream)
    return stream


def _translated(loader):
    """torchvision's ImageFolder with a Compose troupe's pipeline runs: its translation
    (troupe/_translate.py), the data group's C++ pipeline then making its batches; else None
    (Python workers). One line says which, and why."""
    from troupe import _translate
    dataset = loader.dataset
    name = "DataLoader %d" % Process.streams
    try:
        if not loader._translate:
            raise _translate.Untranslatable("translate=False")
        if _per_sample_hooks(loader):
            raise _translate.Untranslatable("a worker_init_fn runs in Python workers")
        if loader.collate_fn is not loader._torch.utils.data.default_collate:
            raise _translate.Untranslatable("a collate_fn of the script's")
        native = _translate.translate(dataset)
    except _translate.Untranslatable as why:
        if _translate.is_folder(dataset):
            print(f"troupe.data: {name}: the dataset's transform runs in Python workers: "
                  f"{why}", flush=True)
        return None
    scaled = (", JPEGs decoded at a DCT scale where it shrinks them (decode_scaling=True: "
              "not torchvision's pixels)" if loader._decode_scaling else "")
    print(f"troupe.data: {name}: torchvision's {type(dataset).__name__} {native.path} is "
          f"decoded and transformed by the data group's C++ pipeline: {native.spec}{scaled} "
          "(translate=False: Python workers)", flush=True)
    return native


def _per_sample_hooks(loader):
    """Whether the script hooks the workers (worker_init_fn): then an ImageDataset runs in
    Python workers too, so that the hook runs."""
    return loader.worker_init_fn is not None


def _ranked(loader, stream, rank=None):
    """This process's DDP rank, into the environment as torchrun sets it."""
    rank = dict(rank or _native.rank())
    rank.pop("SEED", 0)  # (the job's own seed: the ranks' order is shares_seed()'s)
    _ddp.check_rank(rank)
    loader.rank, loader.world_size = rank["RANK"], rank["WORLD_SIZE"]
    loader._planner.ranked(loader.rank, loader.world_size, loader._planner.shares_seed())
    # torch.distributed.init_process_group() reads them; set for one rank too, as torchrun
    # --nproc_per_node 1 does, so a DDP script runs unchanged on one instance.
    for name, value in rank.items():
        os.environ[name] = str(value)
    # gloo's and NCCL's sockets on the interface that reaches rank 0 (the cluster's private
    # network), not whatever the host name resolves to; a value the job set stays.
    interface = interface_to(str(rank["MASTER_ADDR"])) if loader.world_size > 1 else None
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if interface and not os.environ.get(name):
            os.environ[name] = interface
    if loader.world_size > 1 and stream == 0:
        print(f"troupe.data: DDP rank {loader.rank} of {loader.world_size}, local rank "
              f"{rank['LOCAL_RANK']} of {rank['LOCAL_WORLD_SIZE']} (MASTER_ADDR="
              f"{rank['MASTER_ADDR']} MASTER_PORT={rank['MASTER_PORT']}, collectives on "
              f"{os.environ.get('GLOO_SOCKET_IFNAME') or 'the default interface'}): "
              f"{len(loader)} batches an epoch", flush=True)
    return rank


def _start_local_ranks(count):
    # The instance's other local ranks, as torchrun starts them: this script again, with the
    # same arguments, each fed by its trainers in this process over a socket pair.
    import socket
    import subprocess
    original = getattr(sys, "orig_argv", [sys.executable] + sys.argv)
    command = [sys.executable] + list(original[1:])
    for k in range(1, count):
        mine, theirs = socket.socketpair()
        env = dict(os.environ, TROUPE_LOCAL_FD=str(theirs.fileno()),
                   TROUPE_LOCAL_PARENT=str(os.getpid()))
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            env.pop(name, None)
        child = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),))
        theirs.close()
        _native.serve_local(k, mine.detach(), child.pid)
        Process.local_ranks.append(child)
