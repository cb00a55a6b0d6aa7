"""troupe.data.DataLoader feeding DDP ranks (tests/integration/pytorch_test.cpp): written as a
torch DDP script is, the DataLoader first (data instances serve from it and never return), then
torch.distributed.init_process_group() unchanged, reading the environment troupe set.

    ddp_check.py MODE [SAMPLES [STATE_DIR]]

MODE: slow (train, 2 ms a sample, each rank saying when it is past step 5 of epoch 0: a fault the
test injects lands inside the epoch), train (3 epochs of a small DDP model; rank 0 gathers every
rank's sample ids and steps each epoch and checks every sample once, the same steps on every rank,
and the same parameters on every rank at the end), raise (rank 1 raises inside epoch 1, after 3
steps), stop (slow's samples and train's checks; each rank saves its model, its loader's
state_dict() and the epoch's ids so far to STATE_DIR/rank<r>.<step>.pt every 10 steps and when the
job stops, saying at which step then, and a run that finds them resumes from the newest step every
rank saved: a job stopped, or failed, and run again is checked as one).
Prints `check: ...` lines; exits 1 on a failed check.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import troupe.data

MODE = sys.argv[1]
SAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
STATE_DIR = sys.argv[3] if len(sys.argv) > 3 else None
BATCH = 32


class Indexed(torch.utils.data.Dataset):
    """Sample i: 8 features made from i, its label i % 4."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        if MODE in ("slow", "stop"):
            time.sleep(0.002)
        x = torch.tensor([(i * k) % 13 for k in range(1, 9)], dtype=torch.float32) / 13
        return x, i % 4


class Numbers(torch.utils.data.Dataset):
    """The validation set of `train`: sample i is i (defined before the first DataLoader: a later
    loader's dataset reaches the data instances pickled)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return i


def fail(text):
    print(f"check: FAILED {text}", flush=True)
    sys.exit(1)


# What this rank has trained of the epoch in progress: saved with the model every 10 steps and
# when the job stops, to STATE_DIR/rank<r>.<global step>.pt (the newest two kept). A run resumes
# from the newest step every rank saved: a rank killed between its save and another's leaves
# that step incomplete.
progress = {"epoch": 0, "ids": [], "steps": 0, "sizes": []}
EVERY = 10


def state_path(r, step):
    return os.path.join(STATE_DIR, f"rank{r}.{step}.pt")


def saved_steps(r):
    steps = []
    for name in os.listdir(STATE_DIR):
        head, _, tail = name.partition(".")
        if head == f"rank{r}" and tail.endswith(".pt") and tail[:-3].isdigit():
            steps.append(int(tail[:-3]))
    return sorted(steps)


def save(stopping=False):
    step = progress["epoch"] * len(loader) + progress["steps"]
    path = state_path(rank, step)
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(), **progress}, path + ".new")
    os.replace(path + ".new", path)
    for old in saved_steps(rank)[:-2]:
        os.remove(state_path(rank, old))
    if stopping:
        print(f"check: rank {rank} stopped after step {progress['steps']} of epoch "
              f"{progress['epoch']}, state saved", flush=True)


loader = troupe.data.DataLoader(Indexed(), batch_size=BATCH, shuffle=True, seed=11, with_ids=True,
                                on_stop=(lambda: save(True)) if MODE == "stop" else None)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"check: rank {rank} of {world}, RANK={os.environ.get('RANK')} "
      f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}, len {len(loader)}, gloo on "
      f"{os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
if rank != loader.rank or world != loader.world_size:
    fail(f"torch.distributed says rank {rank} of {world}, the loader {loader.rank} of "
         f"{loader.world_size}")
validation = None
if MODE == "train":
    # A validation loader with torch's DistributedSampler, made once the process group is:
    # each rank its share, a fresh order each epoch (set_epoch).
    validation = troupe.data.DataLoader(
        Numbers(200), batch_size=25, sampler=torch.utils.data.distributed.DistributedSampler(
            Numbers(200), shuffle=True, seed=3))
torch.manual_seed(0)
linear = torch.nn.Linear(8, 4)
saved = None
common = set(saved_steps(0)) if MODE == "stop" else set()
for r in range(1, world):
    common &= set(saved_steps(r))
if common:
    saved = torch.load(state_path(rank, max(common)))
    linear.load_state_dict(saved["model"])
    loader.load_state_dict(saved["loader"])
    print(f"check: rank {rank} resumed after step {saved['steps']} of epoch {saved['epoch']}",
          flush=True)
model = torch.nn.parallel.DistributedDataParallel(linear)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if saved is not None:
    optimizer.load_state_dict(saved["optimizer"])
loss = torch.zeros(())
for epoch in range(saved["epoch"] if saved else 0, 3):
    ids, steps, sizes = [], 0, []
    if saved is not None and epoch == saved["epoch"]:
        ids, steps, sizes = list(saved["ids"]), saved["steps"], list(saved["sizes"])
    progress.update(epoch=epoch, ids=ids, sizes=sizes, steps=steps)
    for (x, y), batch_ids in loader:
        if not torch.equal(y, batch_ids % 4):
            fail(f"epoch {epoch}: a batch's labels are not its samples'")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ids += batch_ids.tolist()
        sizes.append(len(batch_ids))
        steps += 1
        progress["steps"] = steps
        if MODE == "stop" and steps % EVERY == 0:
            save()
        if epoch == 0 and steps in (5, 25):
            print(f"check: rank {rank} past step {steps} of epoch 0", flush=True)
        if MODE == "raise" and rank == 1 and epoch == 1 and steps == 3:
            raise RuntimeError("rank 1 fails on purpose")
    if validation is not None:
        validation.sampler.set_epoch(epoch)
        seen = [i for batch in validation for i in batch.tolist()]
        shares = [None] * world
        dist.all_gather_object(shares, seen)
        if rank == 0:
            every = [i for share in shares for i in share]
            print(f"check: epoch {epoch}: validation {len(every)} samples, "
                  f"{len(set(every))} distinct, {[len(s) for s in shares]} per rank, first "
                  f"{shares[0][:3]}", flush=True)
    everyone = [None] * world
    dist.all_gather_object(everyone, (ids, steps, sizes))
    if rank == 0:
        counts = {}
        for rank_ids, _, _ in everyone:
            for i in rank_ids:
                counts[i] = counts.get(i, 0) + 1
        once = sum(1 for v in counts.values() if v == 1)
        per_rank = [s for _, s, _ in everyone]
        # every batch whole but the rank's short last one, whichever order they came in
        whole = all(all(n == BATCH for n in sorted(sz)[1:]) for _, _, sz in everyone)
        disjoint = len(set().union(*[set(i) for i, _, _ in everyone])) == \
            sum(len(i) for i, _, _ in everyone)
        print(f"check: epoch {epoch}: {sum(counts.values())} samples, {once} once, "
              f"{SAMPLES - len(counts)} missing, steps per rank {per_rank}, whole {whole}, "
              f"disjoint {disjoint}, loss {loss.item():.4f}", flush=True)
        if not whole:
            print(f"check: smallest batches per rank {[sorted(sz)[:3] for _, _, sz in everyone]}",
                  flush=True)
params = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(params) for _ in range(world)]
dist.all_gather(gathered, params)
if rank == 0:
    same = all(torch.equal(g, params) for g in gathered)
    print(f"check: parameters the same on every rank: {same}", flush=True)
dist.destroy_process_group()
print("check: done", flush=True)
