"""A script-mode PyTorch script for `make test-image` (tests/image/image_test.py, the pytorch-*
cases): written as SageMaker's docs have users write one - its own argparse of the
hyperparameters, the data from SM_CHANNEL_TRAIN (Fashion-MNIST's IDX files), the model into
SM_MODEL_DIR - with troupe.data.DataLoader the one troupe line, and what SageMaker's checkpoint
folder is for: on a stop, the model and the loader's state saved to /opt/ml/checkpoints, and the
job run again continues from there.

For the test's count (the test reads it, not this script's verdict): every sample id the script
trained on, per epoch, in SM_OUTPUT_DATA_DIR/ids.json, across a stop and the run that resumes.
One `progress: epoch E/N, step S/T` line per step, as hetero_train prints, for the test's timing.
"""

import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import troupe.data


class FashionMnist(torch.utils.data.Dataset):
    """The first `samples` images of the channel's training file; yields (image, label, id). Each
    item costs `sleep_ms`, so an epoch lasts long enough for the test to act inside it."""

    def __init__(self, folder, samples, sleep_ms):
        with gzip.open(os.path.join(folder, "train-images-idx3-ubyte.gz")) as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
        with gzip.open(os.path.join(folder, "train-labels-idx1-ubyte.gz")) as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8)
        self.images, self.labels = images[:samples], labels[:samples]
        self.sleep = sleep_ms / 1000.0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        image = torch.from_numpy(self.images[i].astype(np.float32) / 255.0).unsqueeze(0)
        return image, int(self.labels[i]), i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--model-dir", default=os.environ["SM_MODEL_DIR"])
    p.add_argument("--train", default=os.environ["SM_CHANNEL_TRAIN"])
    p.add_argument("--output-data-dir", default=os.environ["SM_OUTPUT_DATA_DIR"])
    p.add_argument("--checkpoints", default="/opt/ml/checkpoints")
    args = p.parse_args()

    data = FashionMnist(args.train, args.samples, args.sleep_ms)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ids = {}  # epoch -> every id trained on, in order
    state_file = os.path.join(args.checkpoints, "state.pt")

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "loader": loader.state_dict(), "ids": ids}, state_file)
        print("script: saved the state at the stop to %s" % state_file, flush=True)

    loader = troupe.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=2,
                                    on_stop=save)
    if os.path.exists(state_file):
        state = torch.load(state_file)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        loader.load_state_dict(state["loader"])
        ids = state["ids"]
        print("script: resumed from %s (%d ids trained before)" % (
            state_file, sum(len(v) for v in ids.values())), flush=True)
    env = {k: os.environ.get(k) for k in ("SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_GROUP",
                                          "SM_HOSTS", "SM_CHANNELS", "SM_USER_ARGS")}
    print("script: env " + json.dumps(env, sort_keys=True), flush=True)
    steps = (len(data) + args.batch_size - 1) // args.batch_size
    for epoch in range(max(ids) if ids else 0, args.epochs):
        seen = ids.setdefault(epoch, [])
        step = len(seen) // args.batch_size
        for x, y, batch_ids in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += batch_ids.tolist()
            step += 1
            print("progress: epoch %d/%d, step %d/%d, loss %.4f" % (
                epoch + 1, args.epochs, step, steps, loss.item()), flush=True)
    os.makedirs(args.output_data_dir, exist_ok=True)
    with open(os.path.join(args.output_data_dir, "ids.json"), "w") as f:
        json.dump({str(e): v for e, v in ids.items()}, f)
    torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))
    print("script: done, %d epochs" % args.epochs, flush=True)


if __name__ == "__main__":
    main()
