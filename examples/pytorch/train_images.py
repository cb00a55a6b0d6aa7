"""A small CNN on an ImageFolder of JPEGs with torchvision's transforms, fed by troupe's data group.

train_images_plain.py is a plain PyTorch script; train_images.py is the same with its DataLoader
on troupe's data group (every instance runs it: troupe sim ... -- python3 train_images.py DATA):
its Compose is one troupe translates, so the data instances decode and transform the images in
troupe's C++ pipeline (with translate=False, or a transform troupe does not run, in DataLoader
workers there). `diff train_images_plain.py train_images.py` is the whole change (docs/pytorch.md).

    python3 train_images_plain.py DATA      # DATA/train and DATA/test: ImageFolders
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import troupe.data
from torchvision import transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(32, scale=(0.5, 1.0)), transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.4, 0.4, 0.4), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    test = torchvision.datasets.ImageFolder(os.path.join(args.data, "test"), transforms.Compose([
        transforms.Resize(36), transforms.CenterCrop(32), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    loader = troupe.data.DataLoader(train, args.batch_size, shuffle=True, num_workers=4)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        start, wait, steps, seen = time.perf_counter(), 0.0, 0, 0
        asked = time.perf_counter()
        for images, labels in loader:
            wait += time.perf_counter() - asked
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            seen += len(labels)
            asked = time.perf_counter()
        seconds = time.perf_counter() - start
        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in torch.utils.data.DataLoader(test, batch_size=500):
                correct += (model(images).argmax(1) == labels).sum().item()
        print(f"epoch {epoch + 1}/{args.epochs}: {seen} samples, {steps} steps in {seconds:.1f} s, "
              f"{steps / seconds:.1f} steps/s, data wait {100 * wait / seconds:.0f}%, test accuracy "
              f"{correct / len(test):.4f}", flush=True)


if __name__ == "__main__":
    main()
