#!/usr/bin/env python3
"""Start a troupe training job on a SageMaker heterogeneous cluster.

The seed's configuration by default: data_group = 2 x ml.c5.18xlarge (augmentation),
dnn_group = 1 x ml.p4d.24xlarge (training, and troupe's head). --layout pytorch-example gives the
PyTorch example's 1 x ml.c5.9xlarge + 1 x ml.p3.2xlarge instead.

    python3 deploy/sagemaker/launch.py --image URI --role ARN --data s3://bucket/fashion-mnist/ \\
        [--layout seed|pytorch-example] [--epochs 10] [--hp key=value ...] [--wait]

Needs the SageMaker Python SDK (pip install sagemaker) and AWS credentials; troupe itself does
not. The image is deploy/sagemaker/Dockerfile's, pushed where the role can pull it.

What this script does not have to do, because troupe does it on the instances: decide each
instance's role, form the cluster, move batches from the data group to the dnn group, and stop
every instance when training ends or fails (no instance is left running until max_run).
"""

import argparse
import secrets
import sys

LAYOUTS = {
    # name: [(group, instance type, count), ...]
    "seed": [("data_group", "ml.c5.18xlarge", 2), ("dnn_group", "ml.p4d.24xlarge", 1)],
    "pytorch-example": [("data_group", "ml.c5.9xlarge", 1), ("dnn_group", "ml.p3.2xlarge", 1)],
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True, help="the image URI (built from the Dockerfile)")
    p.add_argument("--role", required=True, help="the SageMaker execution role ARN")
    p.add_argument("--data", required=True,
                   help="S3 prefix with the Fashion-MNIST IDX files (the 'train' channel)")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="seed")
    p.add_argument("--app", default="hetero_train", help="the troupe app in the image")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                   help="another hyperparameter (passed to the app as --KEY VALUE)")
    p.add_argument("--max-run", type=int, default=3600, help="seconds before SageMaker stops it")
    p.add_argument("--job-name", default=None)
    p.add_argument("--wait", action="store_true", help="wait for the job and stream its logs")
    p.add_argument("--dry-run", action="store_true",
                   help="print the instance groups and hyperparameters, start nothing")
    return p.parse_args(argv)


def hyperparameters(args):
    hps = {
        "troupe_app": args.app,
        # The same secret on every instance; SageMaker shows hyperparameters in the job's
        # description, so it authenticates the instances of this job to each other, nothing more.
        "troupe_token": secrets.token_hex(16),
        "troupe_head_group": "dnn_group",
        "epochs": str(args.epochs),
        "data-dir": "/opt/ml/input/data/train",
        "model-dir": "/opt/ml/model",
    }
    for kv in args.hp:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            sys.exit("--hp %r: expected KEY=VALUE" % kv)
        hps[key] = value
    return hps


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    hps = hyperparameters(args)
    layout = LAYOUTS[args.layout]
    for group, itype, count in layout:
        print("%-10s %d x %s" % (group, count, itype))
    if args.dry_run:
        print({k: ("<secret>" if k == "troupe_token" else v) for k, v in hps.items()})
        return 0

    from sagemaker.estimator import Estimator
    from sagemaker.inputs import TrainingInput
    from sagemaker.instance_group import InstanceGroup

    groups = [InstanceGroup(group, itype, count) for group, itype, count in layout]
    estimator = Estimator(
        image_uri=args.image,
        role=args.role,
        instance_groups=groups,
        hyperparameters=hps,
        max_run=args.max_run,
        base_job_name="troupe-" + args.app.replace("_", "-"),
    )
    # Every group gets the channel: augmenters read their shard on data instances, the trainer
    # reads the test split on the dnn instance.
    train = TrainingInput(args.data, instance_groups=[g for g, _, _ in layout])
    estimator.fit({"train": train}, job_name=args.job_name, wait=args.wait, logs=args.wait)
    print("started", estimator.latest_training_job.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
