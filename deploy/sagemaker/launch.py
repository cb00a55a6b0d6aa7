#!/usr/bin/env python3
"""Start a troupe training job on a SageMaker heterogeneous cluster.

The seed's configuration by default: data_group = 2 x ml.c5.18xlarge (augmentation),
dnn_group = 1 x ml.p4d.24xlarge (training, and troupe's head). --layout pytorch-example gives the
PyTorch example's 1 x ml.c5.9xlarge + 1 x ml.p3.2xlarge instead.

    python3 deploy/sagemaker/launch.py --image URI --role ARN --data s3://bucket/fashion-mnist/ \\
        [--layout seed|pytorch-example] [--epochs 10] [--hp key=value ...] [--wait]
        [--spot [--max-wait SECONDS] [--checkpoint-s3 URI] [--checkpoint-every STEPS]]

Needs the SageMaker Python SDK (pip install sagemaker) and AWS credentials; troupe itself does
not. The image is deploy/sagemaker/Dockerfile's, pushed where the role can pull it.

What this script does not have to do, because troupe does it on the instances: decide each
instance's role, form the cluster, move batches from the data group to the dnn group, and stop
every instance when training ends or fails (no instance is left running until max_run).

The job secret (the same on every instance; troupe/secret.h) is not a hyperparameter, which
DescribeTrainingJob would show to anyone allowed to call it. This script writes a fresh one to a
file only you can read, uploads it with server-side encryption to
s3://<the session's default bucket>/<job name>/troupe-secret/secret (--secret-s3 names another
place, --kms-key a KMS key), and passes it as the input channel `troupe-secret` to every group;
SageMaker puts it at /opt/ml/input/data/troupe-secret/secret, where troupe reads it. With --wait
the object is deleted when the job ends; otherwise delete it once the job has started.

--spot runs on managed spot capacity (use_spot_instances, max_wait): when SageMaker reclaims it,
every instance gets SIGTERM, the trainer writes a checkpoint to /opt/ml/checkpoints (synced to
checkpoint_s3_uri, by default s3://<default bucket>/<job name>/checkpoints), and when the job
starts again on new capacity hetero_train resumes from it, every sample of every epoch still
trained exactly once (docs/sagemaker.md, "Managed spot training").
"""

import argparse
import os
import secrets
import sys
import tempfile

LAYOUTS = {
    # name: [(group, instance type, count), ...]
    "seed": [("data_group", "ml.c5.18xlarge", 2), ("dnn_group", "ml.p4d.24xlarge", 1)],
    "pytorch-example": [("data_group", "ml.c5.9xlarge", 1), ("dnn_group", "ml.p3.2xlarge", 1)],
}
SECRET_CHANNEL = "troupe-secret"  # troupe reads /opt/ml/input/data/troupe-secret/<its one file>
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"  # SageMaker's default, hetero_train's too


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
    p.add_argument("--spot", action="store_true",
                   help="managed spot training (use_spot_instances), with checkpoints")
    p.add_argument("--max-wait", type=int, default=None,
                   help="with --spot: seconds of training plus waiting for spot capacity before "
                        "SageMaker gives up (max_wait; more than --max-run; default 2 x --max-run)")
    p.add_argument("--checkpoint-s3", default=None, metavar="S3_URI",
                   help="checkpoint_s3_uri (default with --spot: s3://<default bucket>/<job "
                        "name>/checkpoints); also without --spot, to keep checkpoints")
    p.add_argument("--checkpoint-local-path", default=CHECKPOINT_LOCAL_PATH,
                   help="checkpoint_local_path on the instances (default %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="training steps between checkpoints (hetero_train's default: 100)")
    p.add_argument("--job-name", default=None)
    p.add_argument("--secret-s3", default=None, metavar="S3_URI",
                   help="where to upload the job secret (default: s3://<default bucket>/<job "
                        "name>/troupe-secret/secret)")
    p.add_argument("--kms-key", default=None,
                   help="encrypt the uploaded secret with this KMS key (default: SSE-S3)")
    p.add_argument("--wait", action="store_true", help="wait for the job and stream its logs")
    p.add_argument("--dry-run", action="store_true",
                   help="print the instance groups and hyperparameters, start nothing")
    return p.parse_args(argv)


def hyperparameters(args):
    hps = {
        "troupe_app": args.app,
        "troupe_head_group": "dnn_group",
        "epochs": str(args.epochs),
        "data-dir": "/opt/ml/input/data/train",
        "model-dir": "/opt/ml/model",
    }
    for kv in args.hp:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            sys.exit("--hp %r: expected KEY=VALUE" % kv)
        if key == "troupe_token":
            sys.exit("--hp troupe_token: DescribeTrainingJob shows hyperparameters to anyone "
                     "allowed to call it; this script passes a fresh secret as the input channel "
                     "'%s' instead" % SECRET_CHANNEL)
        if key == "fresh" and args.spot:
            sys.exit("--hp fresh with --spot: every start after a reclaim would set the job's own "
                     "checkpoints aside and train from the beginning again; start over with a new "
                     "--checkpoint-s3 instead")
        hps[key] = value
    if args.checkpoint_every is not None:
        hps["checkpoint-every"] = str(args.checkpoint_every)
    if args.spot or args.checkpoint_s3:
        # Named even when it is the default, which hetero_train also looks in: it then does not
        # depend on SageMaker having made the folder before the job starts.
        hps["checkpoint-dir"] = args.checkpoint_local_path
    return hps


def spot_settings(args, bucket, job_name):
    """The Estimator's keyword arguments for managed spot training and checkpoints: none without
    --spot or --checkpoint-s3. SageMaker needs max_wait > max_run with spot."""
    if args.max_wait is not None and not args.spot:
        sys.exit("--max-wait needs --spot")
    if not args.spot and not args.checkpoint_s3:
        return {}
    uri = args.checkpoint_s3 or "s3://%s/%s/checkpoints" % (bucket, job_name)
    if not uri.startswith("s3://"):
        sys.exit("--checkpoint-s3 %r: expected s3://BUCKET/PREFIX" % uri)
    kwargs = {"checkpoint_s3_uri": uri, "checkpoint_local_path": args.checkpoint_local_path}
    if args.spot:
        max_wait = args.max_wait if args.max_wait is not None else 2 * args.max_run
        if max_wait <= args.max_run:
            sys.exit("--max-wait %d must be more than --max-run %d: it counts the training time "
                     "plus the time spent waiting for spot capacity" % (max_wait, args.max_run))
        kwargs.update({"use_spot_instances": True, "max_wait": max_wait})
    return kwargs


def write_secret(folder):
    """A fresh job secret (32 hex digits) in folder/secret, a file only this user can read."""
    path = os.path.join(folder, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    return path


def secret_uri(args, bucket, job_name):
    return args.secret_s3 or "s3://%s/%s/%s/secret" % (bucket, job_name, SECRET_CHANNEL)


def upload_secret(s3, path, uri, kms_key=None):
    """Uploads the secret file to `uri` with server-side encryption; s3 is a boto3 S3 client."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not uri.startswith("s3://") or not bucket or not key:
        sys.exit("--secret-s3 %r: expected s3://BUCKET/KEY" % uri)
    extra = ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key} if kms_key
             else {"ServerSideEncryption": "AES256"})
    s3.upload_file(path, bucket, key, ExtraArgs=extra)
    return bucket, key


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    hps = hyperparameters(args)
    spot_settings(args, "<default bucket>", "<job name>")  # its refusals before any upload
    layout = LAYOUTS[args.layout]
    for group, itype, count in layout:
        print("%-10s %d x %s" % (group, count, itype))
    if args.dry_run:
        print(hps)
        spot = spot_settings(args, "<default bucket>", args.job_name or "<job name>")
        if spot:
            print("spot and checkpoints: %s" % ", ".join(
                "%s=%s" % (k, spot[k]) for k in sorted(spot)))
        print("channels: train <- %s; %s <- %s (a fresh secret, server-side encrypted); both to "
              "every group" % (args.data, SECRET_CHANNEL,
                               secret_uri(args, "<default bucket>", args.job_name or "<job name>")))
        return 0

    import sagemaker
    from sagemaker.estimator import Estimator
    from sagemaker.inputs import TrainingInput
    from sagemaker.instance_group import InstanceGroup
    from sagemaker.utils import name_from_base

    session = sagemaker.Session()
    base = "troupe-" + args.app.replace("_", "-")
    job_name = args.job_name or name_from_base(base)
    s3 = session.boto_session.client("s3")
    uri = secret_uri(args, session.default_bucket(), job_name)
    with tempfile.TemporaryDirectory() as folder:  # mode 0700, removed with the secret in it
        bucket, key = upload_secret(s3, write_secret(folder), uri, args.kms_key)

    groups = [InstanceGroup(group, itype, count) for group, itype, count in layout]
    spot = spot_settings(args, session.default_bucket(), job_name)
    estimator = Estimator(
        image_uri=args.image,
        role=args.role,
        instance_groups=groups,
        hyperparameters=hps,
        max_run=args.max_run,
        base_job_name=base,
        sagemaker_session=session,
        **spot,
    )
    # Every group gets both channels: augmenters read their shard on data instances, the trainer
    # reads the test split on the dnn instance; every instance needs the secret.
    everyone = [g for g, _, _ in layout]
    channels = {
        "train": TrainingInput(args.data, instance_groups=everyone),
        SECRET_CHANNEL: TrainingInput(uri, instance_groups=everyone),
    }
    try:
        estimator.fit(channels, job_name=job_name, wait=args.wait, logs=args.wait)
        print("started", estimator.latest_training_job.name)
    finally:
        if args.wait:
            s3.delete_object(Bucket=bucket, Key=key)
    if not args.wait:
        print("the job secret is at %s: delete it once the job has started" % uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
