#!/usr/bin/env python3
"""Start a troupe training job on a SageMaker (heterogeneous) cluster: your PyTorch script in script
mode, or an app in the image.

    # your script: the folder is uploaded as sourcedir.tar.gz, as the SageMaker SDK does
    python3 deploy/sagemaker/launch.py --image URI --role ARN \\
        --entry-point train.py --source-dir src/ \\
        --instance-group data_group=2:ml.c5.9xlarge --instance-group dnn_group=2:ml.g5.xlarge \\
        --channel train=s3://bucket/images/train --channel test=s3://bucket/images/test \\
        --hp epochs=3 --hp batch-size=64 [--wait] [--dry-run]

    # an app in the image (default hetero_train, the seed's layout, Fashion-MNIST's channel)
    python3 deploy/sagemaker/launch.py --image URI --role ARN --data s3://bucket/fashion-mnist/

Instance groups: --instance-group NAME=COUNT:TYPE, repeated (or --layout seed|pytorch-example:
the seed's 2 x ml.c5.18xlarge + 1 x ml.p4d.24xlarge, or 1 x ml.c5.9xlarge + 1 x ml.p3.2xlarge).
troupe's head is the first host of the first group with GPUs, or --head-group's. Channels:
--channel NAME=S3_URI, repeated, each given to every group (--data S3_URI is --channel train=).
Hyperparameters: --hp KEY=VALUE, repeated, or --hyperparameters '{"epochs": 3}'. A --hp value
is typed as the SDK's users type it in Python: JSON where it is a number, true, false, null, a
list or an object (epochs=3 is the SDK's {"epochs": 3}, sent as "3"), else a string (sent as
"\"abc\"", as the SDK sends "abc"). In script mode
the script gets these and nothing else (the SDK's sagemaker_* are for the entry point, troupe's
troupe_* for troupe); an app gets --epochs too (default 10), and hetero_train its data-dir and
model-dir.

--dry-run prints the CreateTrainingJob request this script sends (only the JSON on stdout, for a
JSON tool; the instance groups go to stderr), and starts nothing. Starting a
job needs boto3 and AWS credentials (troupe itself does not): the script uploads the source and
the job secret, then calls CreateTrainingJob with that request. The image is
deploy/sagemaker/Dockerfile's (with PyTorch for a script), pushed where the role can pull
it.

The job secret (the same on every instance; troupe/secret.h) is not a hyperparameter, which
DescribeTrainingJob would show to anyone allowed to call it. This script writes a fresh one to a
file only you can read, uploads it with server-side encryption to
s3://<the default bucket>/<job name>/troupe-secret/secret (--secret-s3 names another place,
--kms-key a KMS key), and passes it as the input channel `troupe-secret` to every group;
SageMaker puts it at /opt/ml/input/data/troupe-secret/secret, where troupe reads it. With --wait
the object is deleted when the job ends; otherwise delete it once the job has started.

--spot runs on managed spot capacity (EnableManagedSpotTraining, MaxWaitTimeInSeconds): when
SageMaker reclaims it, every instance gets SIGTERM, the trainer writes a checkpoint to
/opt/ml/checkpoints (synced to CheckpointConfig's S3 URI, by default
s3://<default bucket>/<job name>/checkpoints), and when the job starts again on new capacity it
resumes from it (docs/sagemaker.md, "Managed spot training").
"""

import argparse
import json
import os
import re
import secrets
import sys
import tarfile
import tempfile
import time

LAYOUTS = {
    # name: [(group, instance type, count), ...]
    "seed": [("data_group", "ml.c5.18xlarge", 2), ("dnn_group", "ml.p4d.24xlarge", 1)],
    "pytorch-example": [("data_group", "ml.c5.9xlarge", 1), ("dnn_group", "ml.p3.2xlarge", 1)],
}
SECRET_CHANNEL = "troupe-secret"  # troupe reads /opt/ml/input/data/troupe-secret/<its one file>
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"  # SageMaker's default, hetero_train's too
GROUP = re.compile(r"([A-Za-z0-9_-]+)=([0-9]+):(ml\.[a-z0-9.-]+)")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True, help="the image URI (built from the Dockerfile)")
    p.add_argument("--role", required=True, help="the SageMaker execution role ARN")
    p.add_argument("--entry-point", help="script mode: the script to run (a path in --source-dir, "
                                         "or a file whose folder is the source)")
    p.add_argument("--source-dir", help="script mode: the folder uploaded as sourcedir.tar.gz "
                                        "(its requirements.txt installed on every instance)")
    p.add_argument("--app", default=None,
                   help="an app in the image instead of a script (default hetero_train)")
    p.add_argument("--instance-group", action="append", default=[], metavar="NAME=COUNT:TYPE",
                   help="an instance group, e.g. dnn_group=2:ml.g5.xlarge (repeat for each)")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default=None,
                   help="preset instance groups (default without --instance-group: seed)")
    p.add_argument("--head-group", help="the group whose first host is troupe's head (default: "
                                        "the first group with GPUs)")
    p.add_argument("--channel", action="append", default=[], metavar="NAME=S3_URI",
                   help="an input channel for every group (repeat for each)")
    p.add_argument("--data", help="the 'train' channel's S3 prefix (= --channel train=S3_URI)")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter (the script or app gets --KEY VALUE)")
    p.add_argument("--hyperparameters", default=None, metavar="JSON",
                   help="hyperparameters as one JSON object")
    p.add_argument("--epochs", type=int, default=None,
                   help="an app's epochs (default 10); a script's are one of its --hp")
    p.add_argument("--max-run", type=int, default=3600, help="seconds before SageMaker stops it")
    p.add_argument("--volume-size", type=int, default=30, help="GB of disk per instance")
    p.add_argument("--output-s3", default=None, metavar="S3_URI",
                   help="where SageMaker puts model.tar.gz (default s3://<default bucket>/)")
    p.add_argument("--region", default=None, help="the AWS region (default: boto3's)")
    p.add_argument("--spot", action="store_true",
                   help="managed spot training, with checkpoints")
    p.add_argument("--max-wait", type=int, default=None,
                   help="with --spot: seconds of training plus waiting for spot capacity before "
                        "SageMaker gives up (more than --max-run; default 2 x --max-run)")
    p.add_argument("--checkpoint-s3", default=None, metavar="S3_URI",
                   help="CheckpointConfig's S3 URI (default with --spot: s3://<default bucket>/"
                        "<job name>/checkpoints); also without --spot, to keep checkpoints")
    p.add_argument("--checkpoint-local-path", default=CHECKPOINT_LOCAL_PATH,
                   help="the checkpoints' folder on the instances (default %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="hetero_train: training steps between checkpoints (its default: 100)")
    p.add_argument("--job-name", default=None)
    p.add_argument("--secret-s3", default=None, metavar="S3_URI",
                   help="where to upload the job secret (default: s3://<default bucket>/<job "
                        "name>/troupe-secret/secret)")
    p.add_argument("--kms-key", default=None,
                   help="encrypt the uploaded secret with this KMS key (default: SSE-S3)")
    p.add_argument("--wait", action="store_true", help="wait for the job, saying its status")
    p.add_argument("--dry-run", action="store_true",
                   help="print the CreateTrainingJob request, start nothing")
    args = p.parse_args(argv)
    if args.entry_point and args.app:
        p.error("--entry-point (a script) and --app (an app in the image) both say what to run: "
                "give one")
    if args.source_dir and not args.entry_point:
        p.error("--source-dir needs --entry-point, the script in it to run")
    if args.instance_group and args.layout:
        p.error("--instance-group and --layout both give the instance groups: give one")
    if args.entry_point and args.epochs is not None:
        p.error("--epochs is an app's; give a script's as --hp epochs=N")
    return args


def script_mode(args):
    return args.entry_point is not None


def source(args):
    """(the source folder, the entry point relative to it), or exits naming what is wrong."""
    folder = args.source_dir or os.path.dirname(os.path.abspath(args.entry_point))
    if not os.path.isdir(folder):
        sys.exit("--source-dir %r: no such folder" % folder)
    entry = args.entry_point
    if args.source_dir is None:
        entry = os.path.basename(entry)
    elif os.path.isabs(entry) or not os.path.exists(os.path.join(folder, entry)):
        inside = os.path.relpath(os.path.abspath(entry), os.path.abspath(folder))
        if inside.startswith("..") or not os.path.exists(os.path.join(folder, inside)):
            sys.exit("--entry-point %r is not in --source-dir %r (it has: %s)" % (
                args.entry_point, folder, ", ".join(sorted(os.listdir(folder))) or "nothing"))
        entry = inside
    return folder, entry


def instance_groups(args):
    if not args.instance_group:
        return LAYOUTS[args.layout or "seed"]
    groups, names = [], set()
    for text in args.instance_group:
        m = GROUP.fullmatch(text)
        if not m or int(m.group(2)) < 1:
            sys.exit("--instance-group %r: expected NAME=COUNT:TYPE with a count of at least 1, "
                     "e.g. dnn_group=2:ml.g5.xlarge" % text)
        if m.group(1) in names:
            sys.exit("--instance-group %r: a second group named %s" % (text, m.group(1)))
        names.add(m.group(1))
        groups.append((m.group(1), m.group(3), int(m.group(2))))
    return groups


def channels(args):
    out = {}
    given = list(args.channel) + (["train=" + args.data] if args.data else [])
    for text in given:
        name, sep, uri = text.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9\.\-_]+", name) or not uri.startswith("s3://"):
            sys.exit("--channel %r: expected NAME=s3://BUCKET/PREFIX" % text)
        if name == SECRET_CHANNEL:
            sys.exit("--channel %s: that channel carries the job secret; name yours otherwise"
                     % name)
        if name in out:
            sys.exit("--channel %s given twice (--data is the 'train' channel)" % name)
        out[name] = uri
    return out


def typed(value):
    """A --hp value as the SDK's user writes it in Python: a JSON number, true, false, null, list
    or object as that value, anything else (abc, a path, 3a) as the string."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return value if isinstance(parsed, str) else parsed


def user_hyperparameters(args):
    hps = {}
    if args.hyperparameters:
        try:
            hps = json.loads(args.hyperparameters)
        except ValueError as e:
            sys.exit("--hyperparameters is not JSON: %s" % e)
        if not isinstance(hps, dict):
            sys.exit("--hyperparameters must be a JSON object, e.g. '{\"epochs\": 3}'")
    for kv in args.hp:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            sys.exit("--hp %r: expected KEY=VALUE" % kv)
        hps[key] = typed(value)
    if "troupe_token" in hps:
        sys.exit("--hp troupe_token: DescribeTrainingJob shows hyperparameters to anyone allowed to "
                 "call it; this script passes a fresh secret as the input channel '%s' instead"
                 % SECRET_CHANNEL)
    if "fresh" in hps and args.spot:
        sys.exit("--hp fresh with --spot: every start after a reclaim would set the job's own "
                 "checkpoints aside and train from the beginning again; start over with a new "
                 "--checkpoint-s3 instead")
    return hps


def hyperparameters(args, job_name="<job name>", region="<region>", submit="<source>"):
    """The HyperParameters of the request: all strings, as SageMaker takes them."""
    user = user_hyperparameters(args)
    troupe = {"troupe_head_group": args.head_group} if args.head_group else {}
    if script_mode(args):
        # As the SDK's framework estimators: every value JSON-encoded (the toolkit, and train,
        # decode them), and the entry point's own sagemaker_* hyperparameters.
        hps = {k: json.dumps(v) for k, v in user.items()}
        hps.update({k: json.dumps(v) for k, v in {
            "sagemaker_program": source(args)[1], "sagemaker_submit_directory": submit,
            "sagemaker_container_log_level": 20, "sagemaker_job_name": job_name,
            "sagemaker_region": region}.items()})
        hps.update(troupe)
        return hps
    app = args.app or "hetero_train"
    hps = {"troupe_app": app, "epochs": str(args.epochs if args.epochs is not None else 10)}
    if app == "hetero_train":
        hps.update({"data-dir": "/opt/ml/input/data/train", "model-dir": "/opt/ml/model"})
    hps.update(troupe)
    hps.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in user.items()})
    if args.checkpoint_every is not None:
        hps["checkpoint-every"] = str(args.checkpoint_every)
    if args.spot or args.checkpoint_s3:
        # Named even when it is the default, which hetero_train also looks in: it then does not
        # depend on SageMaker having made the folder before the job starts.
        hps["checkpoint-dir"] = args.checkpoint_local_path
    return hps


def spot_settings(args, bucket, job_name):
    """The request's spot and checkpoint fields: none without --spot or --checkpoint-s3.
    SageMaker needs MaxWaitTimeInSeconds > MaxRuntimeInSeconds with spot."""
    if args.max_wait is not None and not args.spot:
        sys.exit("--max-wait needs --spot")
    if not args.spot and not args.checkpoint_s3:
        return {}
    uri = args.checkpoint_s3 or "s3://%s/%s/checkpoints" % (bucket, job_name)
    if not uri.startswith("s3://"):
        sys.exit("--checkpoint-s3 %r: expected s3://BUCKET/PREFIX" % uri)
    out = {"CheckpointConfig": {"S3Uri": uri, "LocalPath": args.checkpoint_local_path}}
    if args.spot:
        max_wait = args.max_wait if args.max_wait is not None else 2 * args.max_run
        if max_wait <= args.max_run:
            sys.exit("--max-wait %d must be more than --max-run %d: it counts the training time "
                     "plus the time spent waiting for spot capacity" % (max_wait, args.max_run))
        out.update({"EnableManagedSpotTraining": True, "MaxWaitTimeInSeconds": max_wait})
    return out


def source_uri(bucket, job_name):
    return "s3://%s/%s/source/sourcedir.tar.gz" % (bucket, job_name)


def secret_uri(args, bucket, job_name):
    return args.secret_s3 or "s3://%s/%s/%s/secret" % (bucket, job_name, SECRET_CHANNEL)


def request(args, bucket="<default bucket>", job_name="<job name>", region="<region>"):
    """The CreateTrainingJob request (boto3's keyword arguments)."""
    groups = instance_groups(args)
    names = [g for g, _, _ in groups]
    if args.head_group and args.head_group not in names:
        sys.exit("--head-group %s is not one of the instance groups (%s)"
                 % (args.head_group, ", ".join(names)))
    submit = source_uri(bucket, job_name)
    spot = spot_settings(args, bucket, job_name)
    every = dict(channels(args), **{SECRET_CHANNEL: secret_uri(args, bucket, job_name)})
    req = {
        "TrainingJobName": job_name,
        "HyperParameters": hyperparameters(args, job_name, region, submit),
        "AlgorithmSpecification": {"TrainingImage": args.image, "TrainingInputMode": "File"},
        "RoleArn": args.role,
        # Every group gets every channel: a DataLoader's dataset is read on the data instances,
        # a test split on the dnn instance; every instance needs the secret.
        "InputDataConfig": [
            {"ChannelName": name, "InputMode": "File",
             "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                             "S3DataDistributionType": "FullyReplicated",
                                             "InstanceGroupNames": names}}}
            for name, uri in every.items()],
        "OutputDataConfig": {"S3OutputPath": args.output_s3 or "s3://%s/" % bucket},
        "ResourceConfig": {"InstanceGroups": [
            {"InstanceGroupName": g, "InstanceType": t, "InstanceCount": n}
            for g, t, n in groups], "VolumeSizeInGB": args.volume_size},
        "StoppingCondition": {"MaxRuntimeInSeconds": args.max_run},
    }
    if "MaxWaitTimeInSeconds" in spot:
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = spot["MaxWaitTimeInSeconds"]
        req["EnableManagedSpotTraining"] = True
    if "CheckpointConfig" in spot:
        req["CheckpointConfig"] = spot["CheckpointConfig"]
    return req


def write_secret(folder):
    """A fresh job secret (32 hex digits) in folder/secret, a file only this user can read."""
    path = os.path.join(folder, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    return path


def upload_secret(s3, path, uri, kms_key=None):
    """Uploads the secret file to `uri` with server-side encryption; s3 is a boto3 S3 client."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not uri.startswith("s3://") or not bucket or not key:
        sys.exit("--secret-s3 %r: expected s3://BUCKET/KEY" % uri)
    extra = ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key} if kms_key
             else {"ServerSideEncryption": "AES256"})
    s3.upload_file(path, bucket, key, ExtraArgs=extra)
    return bucket, key


def pack_source(folder, path):
    """sourcedir.tar.gz of the folder's contents, as the SDK makes it."""
    with tarfile.open(path, "w:gz") as t:
        for name in sorted(os.listdir(folder)):
            t.add(os.path.join(folder, name), arcname=name)
    return path


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    if script_mode(args):
        source(args)  # its refusals first
    if args.dry_run:
        req = request(args, job_name=args.job_name or "<job name>",
                      region=args.region or "<region>")
        for g in req["ResourceConfig"]["InstanceGroups"]:
            print("%-10s %d x %s" % (g["InstanceGroupName"], g["InstanceCount"],
                                     g["InstanceType"]), file=sys.stderr)
        print(json.dumps(req, indent=2))
        return 0
    request(args)  # every refusal before any upload

    import boto3
    session = boto3.session.Session(region_name=args.region)
    region = session.region_name
    account = session.client("sts").get_caller_identity()["Account"]
    bucket = "sagemaker-%s-%s" % (region, account)  # the SDK's default bucket
    base = "troupe-" + re.sub(r"[^A-Za-z0-9-]", "-", os.path.splitext(
        os.path.basename(args.entry_point or args.app or "hetero_train"))[0])
    job_name = args.job_name or "%s-%s" % (base[:40], time.strftime("%Y-%m-%d-%H-%M-%S"))
    s3 = session.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception:
        s3.create_bucket(Bucket=bucket, **({} if region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": region}}))
    req = request(args, bucket, job_name, region)
    if script_mode(args):
        with tempfile.TemporaryDirectory() as folder:
            tarball = pack_source(source(args)[0], os.path.join(folder, "sourcedir.tar.gz"))
            s3.upload_file(tarball, bucket, "%s/source/sourcedir.tar.gz" % job_name)
    uri = secret_uri(args, bucket, job_name)
    with tempfile.TemporaryDirectory() as folder:  # mode 0700, removed with the secret in it
        secret_bucket, secret_key = upload_secret(s3, write_secret(folder), uri, args.kms_key)
    sm = session.client("sagemaker")
    status = None
    try:
        sm.create_training_job(**req)
        print("started", job_name)
        if args.wait:
            last = None
            while True:
                job = sm.describe_training_job(TrainingJobName=job_name)
                now = (job["TrainingJobStatus"], job.get("SecondaryStatus"))
                if now != last:
                    print("%s: %s (%s)" % (job_name, now[0], now[1]), flush=True)
                    last = now
                if now[0] in ("Completed", "Failed", "Stopped"):
                    status = now[0]
                    if job.get("FailureReason"):
                        print("failure reason: " + job["FailureReason"])
                    break
                time.sleep(30)
    finally:
        if args.wait:
            s3.delete_object(Bucket=secret_bucket, Key=secret_key)
    if not args.wait:
        print("the job secret is at %s: delete it once the job has started" % uri)
        return 0
    return 0 if status == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
