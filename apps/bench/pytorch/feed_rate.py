"""feed_rate: how fast a DataLoader delivers train_images.py's batches (torchvision's ImageFolder,
RandomResizedCrop + flip + ColorJitter + ToTensor + Normalize, batch 64) to a loop that only takes
them - the feed alone, no model. Run by bench_dataloader.py, once per loader:

    feed_rate.py torch DATA --report R [--epochs N] [--worker-cpu C] [--workers W]
        torch's DataLoader, W workers (default 1) pinned to CPU C (or, with --worker-cpus,
        that CPU list), the loop on the others
    feed_rate.py troupe DATA --report R [--epochs N] [--step-ms T] [--workers W]
                                        [--no-per-sample-seed]
        troupe.data.DataLoader under troupe sim: W workers on each data instance

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


def pin_worker(cpus):
    def init(_):
        os.sched_setaffinity(0, cpus)
    return init


def cpu_list(text):
    first, _, last = text.partition("-")
    return set(range(int(first), int(last or first) + 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("loader", choices=["torch", "troupe"])
    p.add_argument("data")
    p.add_argument("--report", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--worker-cpu", type=int, default=1)
    p.add_argument("--worker-cpus", help="the torch workers' CPUs, e.g. 0-1 (else --worker-cpu)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--no-per-sample-seed", action="store_true")
    p.add_argument("--no-translate", action="store_true",
                   help="troupe: the Compose in Python workers, not translated to the C++ "
                        "pipeline")
    p.add_argument("--out-of-order", action="store_true",
                   help="troupe: in_order=False, the batches as they are made")
    p.add_argument("--step-ms", type=float, default=0,
                   help="a step this long per batch (a sleep): batches wait queued, as they do "
                        "for a model slower than the feed")
    args = p.parse_args()
    torch.set_num_threads(1)
    train = image_folder(args.data)
    if args.loader == "torch":
        cpus = cpu_list(args.worker_cpus) if args.worker_cpus else {args.worker_cpu}
        loader = torch.utils.data.DataLoader(train, args.batch_size, shuffle=True,
                                             num_workers=args.workers, persistent_workers=True,
                                             worker_init_fn=pin_worker(cpus))
        others = os.sched_getaffinity(0) - cpus
        if others:
            os.sched_setaffinity(0, others)  # the loop off the workers' CPUs, as the trainer is
    else:
        import troupe.data
        loader = troupe.data.DataLoader(train, args.batch_size, shuffle=True,
                                        num_workers=args.workers,
                                        per_sample_seed=not args.no_per_sample_seed,
                                        in_order=not args.out_of_order,
                                        translate=not args.no_translate)
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
