"""feed_rate: how fast a DataLoader delivers train_images.py's batches (torchvision's ImageFolder,
RandomResizedCrop + flip + ColorJitter + ToTensor + Normalize, batch 64) to a loop that only takes
them - the feed alone, no model. Run by bench_dataloader.py, once per loader:

    feed_rate.py torch DATA --report R [--epochs N] [--worker-cpu C]
        torch's DataLoader, one worker pinned to CPU C, the loop on the others
    feed_rate.py troupe DATA --report R [--epochs N] [--step-ms T]
        troupe.data.DataLoader under troupe sim: its workers on the data instances

Writes R: {"loader", "epochs": [{"batches", "samples", "seconds"}...], "handoff_us_per_batch",
"handoff_batches" (how many batches the handoff was measured on)}.
"""
import argparse
import json
import os
import time

import torch
import torchvision
from torchvision import transforms


def image_folder(data):
    """train_images.py's training set: DATA/train as an ImageFolder, with its transforms."""
    return torchvision.datasets.ImageFolder(os.path.join(data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(32, scale=(0.5, 1.0)), transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.4, 0.4, 0.4), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))


def pin_worker(cpu):
    def init(_):
        os.sched_setaffinity(0, {cpu})
    return init


def main():
    p = argparse.ArgumentParser()
    p.add_argument("loader", choices=["torch", "troupe"])
    p.add_argument("data")
    p.add_argument("--report", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--worker-cpu", type=int, default=1)
    p.add_argument("--step-ms", type=float, default=0,
                   help="a step this long per batch (a sleep): batches wait queued, as they do "
                        "for a model slower than the feed")
    args = p.parse_args()
    torch.set_num_threads(1)
    train = image_folder(args.data)
    if args.loader == "torch":
        loader = torch.utils.data.DataLoader(train, args.batch_size, shuffle=True, num_workers=1,
                                             persistent_workers=True,
                                             worker_init_fn=pin_worker(args.worker_cpu))
        others = os.sched_getaffinity(0) - {args.worker_cpu}
        if others:
            os.sched_setaffinity(0, others)  # the loop off the worker's CPU, as the trainer is
    else:
        import troupe.data
        loader = troupe.data.DataLoader(train, args.batch_size, shuffle=True)
    epochs = []
    for _ in range(args.epochs):
        start, batches, samples = time.perf_counter(), 0, 0
        for images, labels in loader:
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            batches += 1
            samples += len(labels)
        epochs.append({"batches": batches, "samples": samples,
                       "seconds": time.perf_counter() - start})
        print(f"feed_rate {args.loader}: {samples} samples in {epochs[-1]['seconds']:.2f} s",
              flush=True)
    handoffs = loader.handoffs() if args.loader == "troupe" else None
    with open(args.report, "w") as f:
        json.dump({"loader": args.loader, "epochs": epochs,
                   "handoff_us_per_batch": handoffs["us_per_batch"] if handoffs else None,
                   "handoff_batches": handoffs["batches"] if handoffs else None}, f)


if __name__ == "__main__":
    main()
