"""A training script for the tests of troupe.data (tests/integration/pytorch_test.cpp): a small
model trained on the stream, which writes every sample id it trains on, so the test counts the
samples from the script's end as well as from the trainer's (stream.report()).

--ids-out FILE   at the end, one line per batch the final model was trained on: "<epoch> <id> ...";
                 a resumed run starts from the lines saved with the state it resumes
--checkpoint F   torch.save of model + optimizer + stream + those lines on a stop (and every
                 --save-every steps); resumed from when present
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
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="normalize=False: the received bytes")
    p.add_argument("--report", default="")
    args = p.parse_args()

    trained = []  # "<epoch> <id> ..." per batch the model was trained on
    model = torch.nn.Linear(784, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def save(why="stopped"):
        if args.checkpoint:
            temp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "stream": stream.state_dict(), "trained": trained}, temp)
            os.replace(temp, args.checkpoint)
            print(f"feed_check: state saved to {args.checkpoint} ({why}, {len(trained)} batches)",
                  flush=True)

    stream = troupe.data.AugmentedBatches(batch_size=128, epochs=args.epochs, with_ids=True,
                                          train_samples=args.train_samples, augment=args.augment,
                                          on_stop=save, normalize=not args.raw)
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        stream.load_state_dict(state["stream"])
        trained = state["trained"]
        print(f"feed_check: resumed after {len(trained)} batches", flush=True)

    step = 0
    for epoch in stream.epochs():
        for images, labels, sample_ids in epoch:
            assert images.shape[1:] == (1, 28, 28), images.shape
            if args.raw:
                assert images.dtype == torch.uint8, images.dtype
                images = troupe.data.normalize(images)
            assert images.dtype == torch.float32, images.dtype
            assert labels.dtype == torch.int64 and len(labels) == len(sample_ids)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images.flatten(1)), labels)
            loss.backward()
            optimizer.step()
            trained.append(f"{epoch} " + " ".join(str(int(i)) for i in sample_ids))
            step += 1
            print(f"feed_check: epoch {epoch + 1} step {step} loss {loss.item():.3f}", flush=True)
            if step == args.raise_at_step:
                raise ValueError(f"the test's exception at step {step}")
            if args.save_every and step % args.save_every == 0:
                save(f"step {step}")
    with open(args.ids_out, "w") as ids:
        ids.write("\n".join(trained) + "\n")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(stream.report(), f)
    print("feed_check: done", flush=True)


if __name__ == "__main__":
    main()
