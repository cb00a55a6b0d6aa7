"""The seeds' PyTorch example: PyTorch's MNIST CNN on Fashion-MNIST with heavy augmentation.

train.py is fed by troupe's data group (every instance runs it: troupe sim ... -- python3 train.py);
train_plain.py is the same script in one process, augmenting on its DataLoader's workers.
`diff train_plain.py train.py` shows everything that changes (docs/pytorch.md).
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

import troupe.data


class Net(nn.Module):
    # pytorch/examples' MNIST CNN; `width` 32 is its size, the default 8 fits a small CPU.
    def __init__(self, width=8):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, 1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(12 * 12 * 2 * width, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def timed(batches, clock):
    # The batches, adding the time spent waiting for each to clock["wait"].
    batches = iter(batches)
    while True:
        start = time.perf_counter()
        batch = next(batches, None)
        clock["wait"] += time.perf_counter() - start
        if batch is None:
            return
        clock["steps"] += 1
        yield batch


def test(model, device, images, labels):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(labels), 1000):
            x = troupe.data.normalize(images[i:i + 1000]).unsqueeze(1).to(device)
            correct += (model(x).argmax(1).cpu() == labels[i:i + 1000]).sum().item()
    return correct / len(labels)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the GPU where there is one")
    p.add_argument("--train-samples", type=int, default=0, help="the first N (0: all 60,000)")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--checkpoint", default="", help="resume from / save to this file")
    p.add_argument("--report", default="", help="write the epochs' figures here (JSON)")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")

    def save():
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()},
                       args.checkpoint)

    dataset = troupe.data.FashionMNIST(train_samples=args.train_samples)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, persistent_workers=True,
                                         pin_memory=cuda)
    model = Net(args.width).to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    test_images, test_labels = troupe.data.fashion_mnist("test")

    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])

    epochs = []
    for epoch in range(scheduler.last_epoch, args.epochs):  # the epochs still to train
        model.train()
        clock = {"wait": 0.0, "steps": 0, "start": time.perf_counter()}
        for images, labels in timed(loader, clock):
            images = images.to(device, non_blocking=True)  # from page-locked memory
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), labels)
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - clock["start"]
        scheduler.step()
        accuracy = test(model, device, test_images, test_labels)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.4f}, "
              f"test accuracy {accuracy:.4f}, {clock['steps']} steps in {seconds:.1f} s, "
              f"data wait {100 * clock['wait'] / seconds:.0f}%", flush=True)
        epochs.append({"epoch": epoch, "accuracy": accuracy, "seconds": seconds,
                       "steps": clock["steps"], "wait_seconds": clock["wait"]})
        save()
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"epochs": epochs}, f)


if __name__ == "__main__":
    main()
