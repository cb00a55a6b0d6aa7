"""A training script written for SageMaker's script mode, as its docs have users write one: its
own argparse of the hyperparameters, the data from SM_CHANNEL_TRAIN, the model into SM_MODEL_DIR.
The one troupe line is the DataLoader. tests/integration/pytorch_script_mode_test.cpp ships this
folder as the estimator's source_dir (sourcedir.tar.gz, with requirements.txt) and runs it through
deploy/sagemaker/train on every instance of a troupe sim cluster."""

import argparse
import json
import os

import torch
import troupe.data


class Rows(torch.utils.data.Dataset):
    """rows.csv: one `x,y` a line (y = 3x + 1); yields (x, y, its index)."""

    def __init__(self, path):
        with open(path) as f:
            self.rows = [tuple(float(v) for v in line.split(",")) for line in f if line.strip()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        x, y = self.rows[i]
        return torch.tensor([x]), torch.tensor(y), i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--model-dir", default=os.environ["SM_MODEL_DIR"])
    p.add_argument("--train", default=os.environ["SM_CHANNEL_TRAIN"])
    args = p.parse_args()

    data = Rows(os.path.join(args.train, "rows.csv"))
    loader = troupe.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=2)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        seen = []
        for x, y, ids in loader:
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += ids.tolist()
        print("script-mode epoch %d: %d samples, %d distinct of %d, loss %.4f"
              % (epoch, len(seen), len(set(seen)), len(data), loss.item()), flush=True)
    torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))
    names = ("SM_CURRENT_HOST", "SM_HOSTS", "SM_CURRENT_INSTANCE_GROUP", "SM_CHANNELS",
             "SM_HP_EPOCHS", "SM_USER_ARGS", "SM_MODULE_NAME")
    print("script-mode env: " + json.dumps({k: os.environ.get(k) for k in names}), flush=True)
    print("script-mode args: epochs %d, batch size %d, lr %g, cwd %s"
          % (args.epochs, args.batch_size, args.lr, os.getcwd()), flush=True)


if __name__ == "__main__":
    main()
