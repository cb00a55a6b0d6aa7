"""How troupe.data.DataLoader plans a pass (one iter()): with torch's own sampler objects and
draws - the batches of one iter() of torch's DataLoader given the same arguments, and its base
seed drawn from the same generator, in the same order (torch's _BaseDataLoaderIter draws the base
seed, then its sampler draws) - a DDP rank's share of it, and the epoch the script is in."""

import numpy

from troupe._common import _native, _torch


def draw_base_seed(generator):
    """torch's _BaseDataLoaderIter: a base seed from `generator` (torch's global one if None)."""
    torch = _torch()
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class Planner:
    """The passes of one DataLoader: the indices each iter() makes, as torch's DataLoader with
    the same arguments would, or, for DDP ranks without a sampler of their own, each rank's share
    of one order all ranks agree on (as torch's DistributedSampler: the order from seed + epoch,
    the seed shares_seed(); troupe/dataset/epoch.h's BatchedEpoch cuts the shares, without
    DistributedSampler's padding)."""

    def __init__(self, spec, dataset_size, batch_size, drop_last, shuffle, own_sampler,
                 seed=None, generator=None):
        self.spec = spec  # the torch DataLoader built from the script's arguments (not iterated)
        self.size = dataset_size
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = bool(shuffle)
        self.own_sampler = own_sampler  # the script gave a sampler or a batch_sampler
        self.rank, self.world_size, self.seed = 0, 1, 0
        self._given = seed, generator

    def shares_seed(self):
        """The seed of the ranks' shared order (with the epoch, as DistributedSampler's seed):
        the loader's seed=, else its generator's own seed (a seeded generator, the same on every
        rank, gives the same order in every run), else 0, DistributedSampler's default. Never a
        draw: the ranks' generators stay as torch leaves them."""
        seed, generator = self._given
        if seed is not None:
            return seed
        if generator is not None:
            return generator.initial_seed()
        return 0

    def ranked(self, rank, world_size, seed):
        """This process is DDP rank `rank` of `world_size`; `seed`: the ranks' shared one."""
        self.rank, self.world_size, self.seed = rank, world_size, seed

    @property
    def shared(self):
        """Whether the ranks share each pass (several ranks, troupe's default sampler)."""
        return self.world_size > 1 and not self.own_sampler

    def __len__(self):
        """Batches per pass (of a DDP rank, its share), as len(torch's DataLoader)."""
        if not self.shared:
            return len(self.spec._index_sampler)
        used = len(_native.rank_share(numpy.arange(self.size, dtype=numpy.uint32),
                                      self.batch_size, self.drop_last, self.rank, self.world_size))
        return (used + self.batch_size - 1) // self.batch_size

    def batches(self, label):
        """The pass's batches of sample indices (lists), in order; without automatic batching
        (batch_size=None) one index each."""
        if self.shared:
            yield from self._share(label)
            return
        auto = self.spec._auto_collation
        for batch in self.spec._index_sampler:
            yield list(batch) if auto else [batch]

    def _order(self, label):
        """The whole pass's order of every rank (the ranks' shared plan)."""
        torch = _torch()
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed((self.seed + label) % 2**63)
            return torch.randperm(self.size, generator=g).numpy().astype(numpy.uint32)
        return numpy.arange(self.size, dtype=numpy.uint32)

    def _share(self, label):
        mine = _native.rank_share(self._order(label), self.batch_size, self.drop_last,
                                  self.rank, self.world_size)
        for k in range(0, len(mine), self.batch_size):
            yield mine[k:k + self.batch_size].tolist()

    def places(self, label, count):
        """Each of this rank's `count` positions' place in the whole pass of every DDP rank,
        which seeds its sample's random draws (so no two ranks draw alike): in the ranks' shared
        plan, where the whole order has it; with a sampler of the script's (DistributedSampler's
        interleaving), position x ranks + rank. None for one rank: the position itself."""
        if self.world_size <= 1:
            return None
        if self.shared:
            # rank_share() of the positions themselves gives the places of this rank's share.
            return _native.rank_share(numpy.arange(self.size, dtype=numpy.uint32),
                                      self.batch_size, self.drop_last, self.rank,
                                      self.world_size).astype(numpy.uint64)[:count]
        return numpy.arange(count, dtype=numpy.uint64) * self.world_size + self.rank

    def plan(self, label):
        """The whole pass: (ids, ends, places), numpy arrays of its indices by position, each
        batch's end and each position's place in the whole pass of every rank (None: one rank).
        Raises naming what the sampler gave that is not an index of the dataset."""
        ids, ends = [], []
        for batch in self.batches(label):
            if not batch:
                continue  # (a batch sampler's empty batch: nothing to make)
            ids.extend(batch)
            ends.append(len(ids))
        try:
            out = numpy.asarray(ids, dtype=numpy.int64)
        except (TypeError, ValueError) as e:
            raise TypeError("DataLoader: its sampler gave indices that are not integers; the data "
                            "group makes items by integer index (pass local=True for torch's "
                            "DataLoader on this instance)") from e
        if len(out) and (out.min() < 0 or out.max() >= self.size):
            bad = int(out.min()) if out.min() < 0 else int(out.max())
            raise IndexError(f"DataLoader: its sampler gave index {bad} for a dataset of "
                             f"{self.size} samples")
        return (out.astype(numpy.uint32), numpy.asarray(ends, dtype=numpy.uint32),
                self.places(label, len(out)))
