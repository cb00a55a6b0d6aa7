"""A training script for the tests of troupe.data (tests/integration/pytorch_test.cpp): a small
model trained on the stream, which writes every sample id it trains on, so the test counts the
samples from the script's end as well as from the trainer's (stream.report()).

--ids-out FILE   one line per trained batch: "<epoch> <id> <id> ...", appended (a resumed run adds
                 to the interrupted run's lines), flushed before any state is saved
--checkpoint F   torch.save of model + optimizer + stream on a stop; resumed from when present
--raise-at-step  raise ValueError at that step (the test of a failing script)
--report FILE    stream.report() as JSON, once every epoch was iterated
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import troupe.data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-samples", type=int, default=6400)
    p.add_argument("--augment", default="light")
    p.add_argument("--ids-out", required=True)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--raise-at-step", type=int, default=0)
    p.add_argument("--report", default="")
    args = p.parse_args()

    ids = None
    model = torch.nn.Linear(784, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def save():
        ids.flush()
        os.fsync(ids.fileno())
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "stream": stream.state_dict()}, args.checkpoint)
            print(f"feed_check: state saved to {args.checkpoint}", flush=True)

    stream = troupe.data.AugmentedBatches(batch_size=128, epochs=args.epochs, with_ids=True,
                                          train_samples=args.train_samples, augment=args.augment,
                                          on_stop=save)
    ids = open(args.ids_out, "a")
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        stream.load_state_dict(state["stream"])
        print("feed_check: resumed", flush=True)

    step = 0
    for epoch in stream.epochs():
        for images, labels, sample_ids in epoch:
            assert images.dtype == torch.float32 and images.shape[1:] == (1, 28, 28), images.shape
            assert labels.dtype == torch.int64 and len(labels) == len(sample_ids)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images.flatten(1)), labels)
            loss.backward()
            optimizer.step()
            ids.write(f"{epoch} " + " ".join(str(int(i)) for i in sample_ids) + "\n")
            step += 1
            print(f"feed_check: epoch {epoch + 1} step {step} loss {loss.item():.3f}", flush=True)
            if step == args.raise_at_step:
                raise ValueError(f"the test's exception at step {step}")
    ids.close()
    if args.report:
        with open(args.report, "w") as f:
            json.dump(stream.report(), f)
    print("feed_check: done", flush=True)


if __name__ == "__main__":
    main()
