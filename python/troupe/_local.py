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

    def __init__(self, owner, iterable, workers, pin_memory):
        self._owner = owner
        if not _workers.in_cluster():
            print(f"troupe.data: not in a troupe cluster: torch's DataLoader with "
                  f"{workers} workers on this machine (run under troupe sim or "
                  "SageMaker for the data group)", flush=True)
        owner._planner.ranked(owner.rank, owner.world_size,
                              owner._seed if owner._seed is not None else 0)
        if iterable:
            # An IterableDataset: torch's DataLoader as it is (no indices to plan or seed by).
            if owner._with_ids:
                raise TypeError("DataLoader: with_ids=True needs a map-style dataset (an "
                                "IterableDataset's items have no index)")
            self._loader = None
            return
        self._seeded = _Seeded(owner.dataset, owner._per_sample_seed)
        self._loader = _loader(owner, self._seeded, workers, pin_memory)

    def __iter__(self):
        """One iter() of the owner: a pass of torch's DataLoader."""
        if self._loader is None:
            return iter(self._owner._spec)
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


def _loader(owner, seeded, workers, pin_memory):
    """torch's DataLoader for `owner` (a troupe.data.DataLoader) over `seeded` (its dataset) with
    `workers` workers here."""
    torch = _torch()
    spec = owner._spec
    return torch.utils.data.DataLoader(
        seeded, batch_sampler=_PlannedBatches(owner), num_workers=workers,
        collate_fn=_LocalCollate(spec.collate_fn, spec._auto_collation), pin_memory=pin_memory,
        timeout=owner.timeout, worker_init_fn=owner.worker_init_fn,
        multiprocessing_context=owner.multiprocessing_context, generator=owner.generator,
        prefetch_factor=owner.prefetch_factor if workers > 0 else 2,
        persistent_workers=owner.persistent_workers and workers > 0)


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
    """A local DataLoader's batch sampler: the plan's batches as (epoch, position, index) keys,
    so that each item is seeded from its position as on the data group."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self):
        return len(self._loader._planner)

    def __iter__(self):
        loader = self._loader
        label = loader._next_label()
        loader._passes += 1
        loader._epochs += 1
        batches = list(loader._planner.batches(label))
        # Each sample seeded from its place in the whole pass of every DDP rank (torchrun).
        places = loader._planner.places(label, sum(len(b) for b in batches))
        position = 0
        for batch in batches:
            keys = [(label, position + k if places is None else int(places[position + k]),
                     int(i)) for k, i in enumerate(batch)]
            position += len(batch)
            yield keys


class _Seeded:
    """A local DataLoader's dataset: the script's, each item's random draws seeded from its
    position in the pass as the data group's workers seed them (the base seed from the worker's
    torch seed, or in this process from the iterator's), and its file named when it raises."""

    def __init__(self, dataset, per_sample_seed):
        self.dataset = dataset
        self.per_sample_seed = per_sample_seed
        self.base = 0
        self._label = None

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        label, position, index = key
        torch = _torch()
        if self._label != label and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(label)
        self._label = label
        if self.per_sample_seed:
            info = torch.utils.data.get_worker_info()
            base = (info.seed - info.id) % 2**64 if info is not None else self.base
            _workers.current_sample_seed = _native.sample_seed(base, position)
            _workers.seed_item(_workers.current_sample_seed)
        try:
            return index, self.dataset[index]
        except Exception as e:  # noqa: BLE001 - named, then raised as it was
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
        ids = [i for i, _ in pairs]
        items = [item for _, item in pairs]
        return ids, (self.collate(items) if self.auto else self.collate(items[0]))
