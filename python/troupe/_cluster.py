"""A troupe.data.DataLoader made in a cluster: a stream of the process's troupe job (started by
python/troupe/_job.py) and its passes. Each iter() is a pass: the script's side plans it here with
torch's own sampler and generator (python/troupe/_plan.py), the trainer hands its batches out to
the data group's workers and checks each arrives once; here they become torch tensors, each pass's
report is filed under the script's epoch, DDP ranks stop at one step, and the stream's position
is its state."""

import json
import os
import pickle

from troupe import _job, _workers
from troupe._common import _native, next_item, stop
from troupe._plan import draw_base_seed

# The ranks' store's key for the step every DDP rank stops at (ClusterLoader._check_stop).
_STOP_KEY = "troupe.data/stop"


class ClusterLoader:
    """How `owner` (a troupe.data.DataLoader) runs in a cluster: its stream's passes."""

    def __init__(self, owner, num_workers, shared_memory_mb, skip_errors, in_order, options):
        self._owner = owner
        self._torch = owner._torch
        self._live = None         # the pass being iterated: its number
        self._begun = False
        self._resume = None       # load_state_dict(): the pass it continues
        self._store = None        # DDP: the ranks' store, where they agree on a stop
        self._taken = {}          # batches the script took, by pass
        self._pass_labels = {}    # the script's epoch of each pass
        self._pid = os.getpid()
        self.stream, self._made_as = _job.join(owner, num_workers, shared_memory_mb,
                                                  skip_errors, in_order, options)
        # The dataset as its workers hold it from now on, to send them what the script changes.
        self._changes = _workers.DatasetChanges(owner.dataset)

    def __iter__(self):
        """One iter() of the owner: its next pass, planned (or, after load_state_dict(), the
        pass the state holds)."""
        owner = self._owner
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
        number = owner._passes
        owner._passes += 1
        if self._resume is not None and self._resume[0] == number and self._resume[1]:
            label = self._resume[2]  # the state holds the pass's plan: the trainer resumes it
        else:
            label = owner._next_label()
            # torch's order: the base seed first (each iter(), or once with persistent workers),
            # then the sampler's draws.
            if not owner.persistent_workers or not hasattr(self, "_base_seed"):
                self._base_seed = draw_base_seed(owner.generator)
                self._base_passes = 0
            else:
                self._base_passes += 1
            ids, ends, places = owner._planner.plan(label)
            seed = _workers.pass_seed(self._base_seed, self._base_passes)
            _native.begin_pass(self.stream, number, ids, ends, seed, label, places,
                               self._dataset_update())
        self._resume = None
        self._pass_labels[number] = label
        self._taken[number] = 0
        self._live = number
        return _Pass(self, number)

    def _dataset_update(self):
        """The script's changes to its Dataset since the DataLoader was made, for the pass's
        workers (pickled; b"": none). Persistent workers keep the dataset they were made with, as
        torch's; troupe's C++ pipeline cannot take a change (a translated Compose is fixed)."""
        owner = self._owner
        if owner.persistent_workers or self._made_as == "tuple":
            # (A troupe.data.ImageDataset's items come from its path and spec: its epoch, which
            # set_epoch() changes, reaches the C++ pipeline as the pass's.)
            return b""
        update = self._changes.pickled()
        if update and self._made_as is not None:
            changed = sorted(pickle.loads(update)[0])
            raise RuntimeError(
                f"DataLoader: the dataset's {', '.join(changed)} changed since the DataLoader was "
                "made, and the data group's C++ pipeline decodes and transforms it as it was "
                "then: make a new DataLoader over the changed dataset, or pass translate=False "
                "for Python workers, which take the change at each epoch")
        return update

    # -- items --
    def _next(self):
        return next_item(self.stream, self._owner._on_stop, timeout=self._owner.timeout)

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
        owner = self._owner
        report = json.loads(item[2])
        number = item[1]
        taken = self._taken.pop(number, 0)
        report["taken"] = taken
        # A peek: the script took at most one batch, then left the pass for another iter().
        peek = report.get("abandoned", 0) > 0 and taken <= 1
        report["peek"] = peek
        if peek:
            owner.peeks.append(report)
        else:
            owner.epoch_reports[report.get("epoch", number)] = report
            owner._epochs += 1

    def _tensors(self, item):
        torch = self._torch
        if isinstance(item[2], list):
            tensors = [torch.from_numpy(a) for a in item[2]]
            structure = json.loads(item[3])
        else:
            tensors = [torch.from_numpy(item[2]), torch.from_numpy(item[3])]
        if self._made_as is not None:
            # troupe's C++ pipeline: (images, targets) as the transform wrote them, on every rank
            # (a local rank's come as tensors) as default_collate makes them.
            structure = {self._made_as: [{"t": 0}, {"t": 1}]}
        if self._owner._pin:
            tensors = [t.pin_memory() for t in tensors]
        batch = _workers.unflatten(structure, tensors)
        if self._owner._with_ids:
            return batch, torch.from_numpy(item[4])
        return batch

    def _check_stop(self, number, index):
        """DDP: the ranks stop at the same step (`index`, the batch about to be taken, of pass
        `number`). A rank that stopped alone would leave the others waiting in their next
        collective (an all-reduce of gradients) until the instances are killed. No collective
        agrees on it - a rank may take batches alone (`next(iter(loader))` on rank 0, to log a
        sample), or leave a pass alone (its timeout), which would pair one rank's collective with
        another's next one: the first rank that finds its job stopping writes "stop before batch
        index + 1 of this epoch" into the ranks' store (torch.distributed's, a compare-and-set:
        the first proposal wins), and every rank reads it before each batch, stopping there. Ranks
        are at most a step apart (their gradients' all-reduce holds the faster one), so none has
        passed it, and each reaches it: their trainers go on handing over the batches already
        made (ScriptLearner::stepsWhileStopping). A later loader stops each rank at its own next
        item (some ranks may not iterate it), as do ranks without a process group."""
        owner = self._owner
        if owner.world_size <= 1:
            return  # one rank: the stop is an item of the stream's (next_item raises Stopped)
        kind, stopping = _native.peek(self.stream, float(owner.timeout))
        if kind == "timeout":
            raise RuntimeError(f"DataLoader timed out after {owner.timeout} seconds")
        store = self._stop_store()
        if store is None:
            if stopping:
                stop(owner._on_stop, "SIGTERM or SIGINT on an instance of the job")
            return
        # The batch's place in the script's epochs: (epoch, index), +1 so that 0 is "none".
        position = ((self._pass_labels.get(number, number) + 1) << 32) | index
        try:
            agreed = store.add(_STOP_KEY, 0)
            if stopping and agreed == 0:
                agreed = int(store.compare_set(_STOP_KEY, "0", str(position + 1)))
        except Exception:  # noqa: BLE001 - the store is rank 0's: it is gone, the job is ending
            agreed = position
        if agreed and position >= agreed:
            # The batch it would take next waits untaken: a state_dict() leaves it out, and a
            # resume sends it again.
            stop(owner._on_stop, "SIGTERM or SIGINT on an instance of the job (every DDP rank "
                                 "stops at this step)")

    def _stop_store(self):
        """The ranks' store (their process group's), for the training loader; else None."""
        dist = self._torch.distributed
        if self.stream != 0 or not (dist.is_available() and dist.is_initialized()):
            return None
        if self._store is None:
            # (torch's own, private, from 1.13 to 2.x; where it is gone, each rank stops alone)
            from torch.distributed import distributed_c10d
            get = getattr(distributed_c10d, "_get_default_store", None)
            self._store = get() if get is not None else False
        return self._store or None

    # -- state --
    def handoffs(self):
        count, seconds = _native.handoffs(self.stream)
        return {"batches": count, "us_per_batch": 1e6 * seconds / count if count else 0.0}

    def state_dict(self):
        return {"troupe_stream": _native.state(self.stream), "version": 2}

    def load_state_dict(self, state):
        if self._begun:
            raise RuntimeError("load_state_dict() after the first iter(): call it first")
        number, planned, label = _native.load_state(self.stream, bytes(state["troupe_stream"]),
                                                    "the loader's state_dict()")
        self._owner._passes = self._owner._epochs = number
        self._resume = (number, planned, label)


class _Pass:
    """One pass of a cluster DataLoader: its batches, then StopIteration."""

    def __init__(self, loader, number):
        self._loader = loader  # the ClusterLoader
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
                passes = loader._owner._passes
                mine = loader._pass_labels.get(self._number, self._number)
                newest = loader._pass_labels.get(passes - 1, passes - 1)
                raise RuntimeError(f"DataLoader: this iterator's epoch {mine} was left when "
                                   f"iter(loader) started epoch {newest}: two live iterators; "
                                   "take batches from the newest one only")
            try:
                loader._check_stop(self._number, loader._taken.get(self._number, 0))
                item = loader._next()
            except RuntimeError as e:
                if "timed out" in str(e):
                    # As torch's iterator after its timeout, this pass is over: what it has not
                    # handed over is not made (its shards free the data group for others).
                    _native.abandon(loader.stream, self._number)
                raise
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
        return len(self._loader._owner)
