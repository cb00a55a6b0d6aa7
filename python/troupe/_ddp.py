"""torchrun's environment on a troupe job's instances (runtime/include/troupe/torchrun.h): the
launcher (troupe sim, SageMaker's train, troupe-node) sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT before the script's first line, so a torchrun
script - init_process_group() first - runs unchanged. A data instance is no rank: it gets a world
of one on itself, so that its script gets through the same first lines to its DataLoader (which
never returns there). Its world is formed with gloo whatever backend the script names: a data
instance has no GPU for NCCL, and computes no gradients."""

import functools
import os


def prepare():
    """On a data instance (TROUPE_DDP_ROLE=data): init_process_group() forms the instance's world
    of one with gloo. Called when troupe.data is imported (before the script's own call)."""
    if os.environ.get("TROUPE_DDP_ROLE") != "data":
        return
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or getattr(dist.init_process_group, "_troupe", False):
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(backend=None, *args, **kwargs):
        kwargs.pop("device_id", None)
        return original("gloo", *args, **kwargs)

    init_process_group._troupe = True
    dist.init_process_group = init_process_group


def check_rank(rank):
    """The rank the job placed this process at (`rank`, troupe.data's) against the one its
    launcher set before the script started: they differ only when the training group changed
    between the two (a host late, or gone); the script's process group then holds other ranks
    than the job's, which would train some samples twice and others never."""
    if os.environ.get("TROUPE_DDP_ROLE") != "rank":
        return
    given = (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
    placed = (str(rank["RANK"]), str(rank["WORLD_SIZE"]))
    if given != placed:
        raise RuntimeError(
            f"troupe.data: this process started as DDP rank {given[0]} of {given[1]} (the "
            f"environment its launcher set from the cluster description) but the job placed it "
            f"as rank {placed[0]} of {placed[1]}: the training group's instances at the start "
            "are not the description's (one is late or gone); start the job again with every "
            "training instance present")
