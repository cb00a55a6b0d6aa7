"""A local troupe.data.DataLoader (plain python3, or local=True): torch's own DataLoader on this
instance, made from the script's arguments, with what keeps its batches and items those the data
group would make - the passes planned as there (python/troupe/_plan.py), each item seeded from its
position in the pass as the data group's workers seed it (python/troupe/_workers.py), a dataset's
set_epoch() called with the script's epoch, a failing item's file named."""

from troupe import _workers
from troupe._common import _native, _torch


class LocalLoader:
    """How `owner` (a troupe.data.DataLoader) runs outside a cluster or with local=True: torch's
    DataLoader with `workers` workers on this instance."""

    stream = None  # no stream of a troupe job
    _begun = False

    def __init__(self, owner, iterable, workers, pin_memory, asked):
        self._owner = owner
        if not _workers.in_cluster():
            print(f"troupe.data: not in a troupe cluster: torch's DataLoader with "
                  f"{workers} workers on this machine (run under troupe sim or "
                  "SageMaker for the data group)", flush=True)
        if asked:
            # local=True: torch's DataLoader on this process, the whole dataset on every rank (a
            # validation rank 0 runs alone), as torch's without a DistributedSampler.
            owner.rank, owner.world_size = 0, 1
        owner._planner.ranked(owner.rank, owner.world_size, owner._planner.shares_seed())
        if iterable:
            # An IterableDataset: torch's DataLoader as it is (no indices to plan or seed by).
            if owner._with_ids:
                raise TypeError("DataLoader: with_ids=True needs a map-style dataset (an "
                                "IterableDataset's items have no index)")
            self._loader = None
            return
        self._seeded = _Seeded(owner.dataset, owner._per_sample_seed, owner._skip_errors)
        self._persistent = owner.persistent_workers and workers > 0
        self.passes = 0  # persistent workers: passes since their base seed was drawn
        self._loader = _loader(owner, self._seeded, workers, pin_memory, _PlannedBatches(self))

    def __iter__(self):
        """One iter() of the owner: a pass of torch's DataLoader."""
        if self._loader is None:
            return iter(self._owner._spec)
        # Persistent workers' base seed is drawn once, each later pass seeded apart from it (set
        # before iter(): torch's workers' iterator asks the batch sampler for batches at once).
        self.passes = self.passes + 1 if self._persistent and self._begun else 0
        self._begun = True
        iterator = iter(self._loader)
        # In this process (no workers) the items' seeds come from the iterator's base seed.
        self._seeded.base = getattr(iterator, "_base_seed", 0)
        return _LocalPass(self._owner, iterator)

    def handoffs(self):
        return {"batches": 0, "us_per_batch": 0.0}

    def state_dict(self):
        raise RuntimeError("state_dict(): a local DataLoader (torch's) has no state")

    def load_state_dict(self, state):
        raise RuntimeError("load_state_dict(): a local DataLoader (torch's) has no state")


def _loader(owner, seeded, workers, pin_memory, batches):
    """torch's DataLoader for `owner` (a troupe.data.DataLoader) over `seeded` (its dataset) with
    `workers` workers here."""
    torch = _torch()
    spec = owner._spec
    # What torch takes only with workers (prefetch_factor, persistent_workers), and what only a
    # later torch has (in_order, torch 2.6), given as the script gave them.
    extra = {}
    if workers > 0:
        extra["persistent_workers"] = owner.persistent_workers
        if owner._prefetch_given is not None:
            extra["prefetch_factor"] = owner._prefetch_given
    if "in_order" in _torch_arguments():
        extra["in_order"] = owner.in_order
    return torch.utils.data.DataLoader(
        seeded, batch_sampler=batches, num_workers=workers,
        collate_fn=_LocalCollate(spec.collate_fn, spec._auto_collation), pin_memory=pin_memory,
        timeout=owner.timeout, worker_init_fn=owner.worker_init_fn,
        multiprocessing_context=owner.multiprocessing_context, generator=owner.generator,
        **extra)


def _torch_arguments():
    """The arguments this torch's DataLoader takes."""
    import inspect
    return inspect.signature(_torch().utils.data.DataLoader.__init__).parameters


class _LocalPass:
    """One pass of a local DataLoader: torch's iterator, with ids where asked."""

    def __init__(self, loader, iterator):
        self._loader = loader
        self._iterator = iterator

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._iterator)

    def __next__(self):
        ids, batch = next(self._iterator)
        if self._loader._with_ids:
            return batch, self._loader._torch.tensor(ids)
        return batch


class _PlannedBatches:
    """A local DataLoader's batch sampler: the plan's batches as (epoch, passes, place, index)
    keys, so that each item is seeded from its place as on the data group."""

    def __init__(self, local):
        self._local = local
        self._loader = local._owner

    def __len__(self):
        return len(self._loader._planner)

    def __iter__(self):
        loader = self._loader
        passes = self._local.passes
        label = loader._next_label()
        loader._passes += 1
        loader._epochs += 1
        batches = list(loader._planner.batches(label))
        # Each sample seeded from its place in the whole pass of every DDP rank (torchrun).
        places = loader._planner.places(label, sum(len(b) for b in batches))
        position = 0
        for batch in batches:
            keys = [(label, passes, position + k if places is None else int(places[position + k]),
                     int(i)) for k, i in enumerate(batch)]
            position += len(batch)
            yield keys


class _Seeded:
    """A local DataLoader's dataset: the script's, each item's random draws seeded from its
    position in the pass as the data group's workers seed them (the base seed from the worker's
    torch seed, or in this process from the iterator's), and its file named when it raises."""

    def __init__(self, dataset, per_sample_seed, skip_errors=False):
        self.dataset = dataset
        self.per_sample_seed = per_sample_seed
        self.skip_errors = skip_errors
        self.base = 0
        self._label = None

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        label, passes, position, index = key
        torch = _torch()
        if self._label != label and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(label)
        self._label = label
        if not self.per_sample_seed:
            return index, self._item(index)
        info = torch.utils.data.get_worker_info()
        base = (info.seed - info.id) % 2**64 if info is not None else self.base
        seed = _native.sample_seed(_workers.pass_seed(base, passes), position)

        def make():
            _workers.current_sample_seed = seed
            _workers.seed_item(seed)
            return self._item(index)
        # In the script's own process (no workers) its generators stay as they were.
        return index, make() if info is not None else _workers.keeping_rng(make)

    def _item(self, index):
        try:
            return self.dataset[index]
        except Exception as e:  # noqa: BLE001 - named, then raised as it was
            if self.skip_errors:
                # Left out of its batch (skip_errors=True), as the data group leaves it out.
                return _Skipped(f"dataset[{index}] raised {type(e).__name__}: {e}")
            path = _workers.sample_file(self.dataset, index)
            if hasattr(e, "add_note"):
                e.add_note(f"troupe.data: dataset[{index}]" + (f" is {path}" if path else ""))
            raise
        finally:
            _workers.current_sample_seed = None


class _LocalCollate:
    """A local DataLoader's collate_fn: the script's over the items, the ids beside."""

    def __init__(self, collate, auto):
        self.collate = collate
        self.auto = auto

    def __call__(self, pairs):
        pairs = [(i, item) for i, item in pairs if not isinstance(item, _Skipped)]
        ids = [i for i, _ in pairs]
        items = [item for _, item in pairs]
        if not items:
            return ids, None  # every sample of the batch left out (as on the data group)
        return ids, (self.collate(items) if self.auto else self.collate(items[0]))


class _Skipped:
    """An item that raised, with skip_errors=True: left out of its batch by the collate."""

    def __init__(self, why):
        self.why = why
