"""A local troupe.data.DataLoader (plain python3, or local=True): torch's own DataLoader on this
instance, made from the script's arguments, with what keeps its batches and items those the data
group would make - the passes planned as there (python/troupe/_plan.py), each item seeded from its
position in the pass as the data group's workers seed it (python/troupe/_workers.py), a dataset's
set_epoch() called with the script's epoch, a failing item's file named."""

from troupe import _workers
from troupe._common import _native, _torch


def loader(owner, workers, pin_memory):
    """torch's DataLoader for `owner` (a troupe.data.DataLoader) with `workers` workers here."""
    torch = _torch()
    spec = owner._spec
    seeded = _Seeded(owner.dataset, owner._per_sample_seed)
    owner._seeded = seeded
    return torch.utils.data.DataLoader(
        seeded, batch_sampler=_PlannedBatches(owner), num_workers=workers,
        collate_fn=_LocalCollate(spec.collate_fn, spec._auto_collation), pin_memory=pin_memory,
        timeout=owner.timeout, worker_init_fn=owner.worker_init_fn,
        multiprocessing_context=owner.multiprocessing_context, generator=owner.generator,
        prefetch_factor=owner.prefetch_factor if workers > 0 else 2,
        persistent_workers=owner.persistent_workers and workers > 0)


def start_pass(owner, local_loader):
    """One iter() of `owner`'s local loader."""
    iterator = iter(local_loader)
    # In this process (no workers) the items' seeds come from the iterator's base seed.
    owner._seeded.base = getattr(iterator, "_base_seed", 0)
    return _LocalPass(owner, iterator)

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
        position = 0
        for batch in loader._planner.batches(label):
            keys = [(label, position + k, int(i)) for k, i in enumerate(batch)]
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
