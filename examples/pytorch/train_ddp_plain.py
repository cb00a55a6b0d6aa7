"""A DDP training script as PyTorch users write it for torchrun: a DistributedSampler in its
DataLoader, torch.distributed set up from the environment torchrun sets.

    torchrun --nproc_per_node 2 train_ddp_plain.py [--samples N] [--epochs E]

On troupe's data group (docs/pytorch.md, "DDP: every rank of the dnn group fed") one statement
changes, the DataLoader's (and `import troupe.data`):

    loader = troupe.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True)

and every instance runs the script (troupe sim ... -- python3 train_ddp.py): each process of the
dnn group is a rank, troupe sets what torchrun sets (also for one rank), and `loader.sampler
.set_epoch()` works as DistributedSampler's. The samples carry their index, and rank 0 gathers
every rank's each epoch: how many samples were trained, how many of them distinct, each rank's
steps.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler


class Quadrants(torch.utils.data.Dataset):
    """Sample i: a 1x16x16 noise image whose quadrant i % 4 is brighter, its label i % 4, and i."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        image = torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(i)) * 0.5
        label = i % 4
        row, column = divmod(label, 2)
        image[:, row * 8:row * 8 + 8, column * 8:column * 8 + 8] += 1.0
        return image, label, i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    dataset = Quadrants(args.samples)
    loader = DataLoader(dataset, args.batch_size, num_workers=2, sampler=DistributedSampler(
        dataset, num_replicas=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"])))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        ids, correct, steps = [], 0, 0
        for images, labels, index in loader:
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (logits.argmax(1) == labels).sum().item()
            ids += index.tolist()
            steps += 1
        everyone = [None] * world
        dist.all_gather_object(everyone, (ids, correct, steps))
        if rank == 0:
            trained = [i for rank_ids, _, _ in everyone for i in rank_ids]
            print(f"epoch {epoch + 1}/{args.epochs}: {len(trained)} samples, "
                  f"{len(set(trained))} distinct of {len(dataset)}, steps per rank "
                  f"{[s for _, _, s in everyone]}, train accuracy "
                  f"{sum(c for _, c, _ in everyone) / len(trained):.3f}", flush=True)
    # The DDP model first, while the process group lives: freed after it, torch 1.13's gloo
    # process group joins its threads holding the GIL one of them waits for (a hang at exit).
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
