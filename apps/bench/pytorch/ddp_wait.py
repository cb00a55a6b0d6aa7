"""ddp_wait: how long each DDP rank waits for its batches from troupe.data.DataLoader, run on every
instance by bench_ddp.py:

    ddp_wait.py DATA --report R [--epochs N] [--step-ms T] [--batch-size B]

train_images.py's ImageFolder and torchvision transforms on the data group; on each rank a step
that stands for a GPU's: a sleep of T ms, then an all_reduce of one number (DDP's collective, which
keeps the ranks in step). Data wait: the time a rank spends in next() on the loader. Rank 0 gathers
every rank's figures and writes R: {"ranks", "epochs": [{"wait_s": [per rank], "seconds",
"batches": [per rank], "samples"}...], "agreement_us"}: with several ranks, what the loader's stop
agreement costs a batch (a gloo all-reduce of one integer, as _cluster.py's
ClusterLoader._agree_stop makes before each item, the ranks in step: mean of 500 after the epochs; null for one rank).
"""
import argparse
import json
import time

import torch
import torch.distributed as dist

import troupe.data
from feed_rate import image_folder  # the same ImageFolder and transforms as bench_dataloader's


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--report", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=150)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    train = image_folder(args.data)
    loader = troupe.data.DataLoader(train, args.batch_size, shuffle=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    epochs = []
    for _ in range(args.epochs):
        start, wait, batches, samples = time.perf_counter(), 0.0, 0, 0
        it = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                _, labels = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - asked
            time.sleep(args.step_ms / 1000)
            dist.all_reduce(torch.ones(1))
            batches += 1
            samples += len(labels)
        everyone = [None] * world
        dist.all_gather_object(everyone, (wait, batches, samples))
        epochs.append({"wait_s": [w for w, _, _ in everyone],
                       "batches": [b for _, b, _ in everyone],
                       "samples": sum(s for _, _, s in everyone),
                       "seconds": time.perf_counter() - start})
        if rank == 0:
            waits = [round(w, 2) for w in epochs[-1]["wait_s"]]
            print(f"ddp_wait: {world} ranks, {epochs[-1]['samples']} samples in "
                  f"{epochs[-1]['seconds']:.1f} s, waits {waits} s", flush=True)
    agreement_us = None
    if world > 1:
        flag = torch.tensor([0])
        for _ in range(50):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        start = time.perf_counter()
        for _ in range(500):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreement_us = 1e6 * (time.perf_counter() - start) / 500
    if rank == 0:
        with open(args.report, "w") as f:
            json.dump({"ranks": world, "epochs": epochs, "agreement_us": agreement_us}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
