#!/usr/bin/env python3
"""deploy/sagemaker/launch.py keeps the job secret out of the hyperparameters (DescribeTrainingJob
shows them): no troupe_token, --hp troupe_token refused; the secret is a fresh 32-hex-digit file
of mode 0600, uploaded with server-side encryption and passed as the troupe-secret channel.
--spot asks for managed spot training with checkpoints: EnableManagedSpotTraining,
MaxWaitTimeInSeconds (more than the run's), a CheckpointConfig per job, and hetero_train's
checkpoint-dir and checkpoint-every; a fresh hyperparameter, which would throw the progress away at every restart, is
refused. Needs no SDK: the S3 client is a stand-in.

usage: launch_check.py LAUNCH_PY
"""
import contextlib
import importlib.util
import io
import json
import os
import re
import stat
import sys
import tempfile

spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)

errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


BASE = ["--image", "i", "--role", "arn:aws:iam::0:role/x", "--data", "s3://b/fashion-mnist"]

# No secret among the hyperparameters, and none can be added.
hps = launch.hyperparameters(launch.parse_args(BASE + ["--hp", "blur=5"]))
check("troupe_token" not in hps, "launch.py sets the hyperparameter troupe_token")
check(not any(re.fullmatch(r"[0-9a-f]{32}", str(v)) for v in hps.values()),
      "a hyperparameter value looks like a secret: %r" % hps)
try:
    with contextlib.redirect_stderr(io.StringIO()):
        launch.hyperparameters(launch.parse_args(BASE + ["--hp", "troupe_token=x"]))
    errors.append("--hp troupe_token=x is accepted")
except SystemExit as e:
    check("troupe-secret" in str(e.code), "--hp troupe_token's refusal does not name the channel")

# The secret file: fresh, 32 hex digits, only its owner can read it.
with tempfile.TemporaryDirectory() as folder:
    path = launch.write_secret(folder)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    check(mode == 0o600, "the secret file has mode %o, not 600" % mode)
    secret = open(path).read()
    check(re.fullmatch(r"[0-9a-f]{32}\n", secret) is not None, "the secret is not 32 hex digits")

    class S3:
        calls = []

        def upload_file(self, filename, bucket, key, ExtraArgs=None):
            self.calls.append((filename, bucket, key, ExtraArgs))

    s3 = S3()
    args = launch.parse_args(BASE)
    uri = launch.secret_uri(args, "sagemaker-us-east-1-0", "troupe-job-1")
    check(uri == "s3://sagemaker-us-east-1-0/troupe-job-1/troupe-secret/secret",
          "the secret's S3 place is %s" % uri)
    launch.upload_secret(s3, path, uri)
    launch.upload_secret(s3, path, uri, kms_key="arn:aws:kms:k")
    check(s3.calls[0][1:3] == ("sagemaker-us-east-1-0", "troupe-job-1/troupe-secret/secret"),
          "uploaded to %r" % (s3.calls[0][1:3],))
    check(s3.calls[0][3] == {"ServerSideEncryption": "AES256"}, "no SSE: %r" % (s3.calls[0][3],))
    check(s3.calls[1][3] == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:aws:kms:k"},
          "no SSE-KMS with --kms-key: %r" % (s3.calls[1][3],))

# The dry run's request names the channel and holds no secret.
out = io.StringIO()
with contextlib.redirect_stdout(out):
    launch.main(BASE + ["--dry-run"])
check("troupe_token" not in out.getvalue(), "the dry run mentions troupe_token")
try:
    json.loads(out.getvalue())  # only the request: a JSON tool reads it
except ValueError as e:
    check(False, "the dry run's stdout is not one JSON object (%s): %s" % (e, out.getvalue()[:200]))
for value, want in (("3", 3), ("0.5", 0.5), ("true", True), ("[1, 2]", [1, 2]), ("abc", "abc"),
                    ("3a", "3a"), ('"x"', '"x"'), ("/opt/ml/x", "/opt/ml/x")):
    check(launch.typed(value) == want, "--hp k=%s is typed %r, not %r" % (value,
                                                                        launch.typed(value), want))
req = launch.request(launch.parse_args(BASE))
secret = [c for c in req["InputDataConfig"] if c["ChannelName"] == "troupe-secret"]
check(len(secret) == 1 and secret[0]["DataSource"]["S3DataSource"]["S3Uri"] ==
      "s3://<default bucket>/<job name>/troupe-secret/secret",
      "the request does not pass the secret's channel: %r" % req["InputDataConfig"])
check(launch.SECRET_CHANNEL == "troupe-secret", "the channel is not troupe-secret")


# Managed spot training: the request's fields, and what hetero_train is told.
def refused(argv, says):
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = launch.parse_args(BASE + argv)
            launch.hyperparameters(args)
            launch.spot_settings(args, "bkt", "job-1")
        errors.append("%s is accepted" % " ".join(argv))
    except SystemExit as e:
        check(says in str(e.code), "%s is refused with %r, not naming %r" % (argv, e.code, says))


args = launch.parse_args(BASE + ["--spot", "--max-run", "7200", "--checkpoint-every", "50"])
spot = launch.spot_settings(args, "bkt", "job-1")
check(spot == {"EnableManagedSpotTraining": True, "MaxWaitTimeInSeconds": 14400,
               "CheckpointConfig": {"S3Uri": "s3://bkt/job-1/checkpoints",
                                    "LocalPath": "/opt/ml/checkpoints"}},
      "--spot gives the request %r" % spot)
req = launch.request(args, "bkt", "job-1", "us-east-1")
check(req["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
      and req.get("EnableManagedSpotTraining") is True and "CheckpointConfig" in req,
      "--spot's request: %r" % req)
hps = launch.hyperparameters(args)
check(hps.get("checkpoint-dir") == "/opt/ml/checkpoints" and hps.get("checkpoint-every") == "50",
      "--spot does not tell hetero_train where and how often to checkpoint: %r" % hps)
args = launch.parse_args(BASE + ["--spot", "--max-wait", "5000", "--checkpoint-s3", "s3://c/p",
                                 "--checkpoint-local-path", "/opt/ml/ck"])
spot = launch.spot_settings(args, "bkt", "job-1")
check(spot["MaxWaitTimeInSeconds"] == 5000 and spot["CheckpointConfig"] ==
      {"S3Uri": "s3://c/p", "LocalPath": "/opt/ml/ck"},
      "the spot settings given are not used: %r" % spot)
check(launch.hyperparameters(args).get("checkpoint-dir") == "/opt/ml/ck",
      "hetero_train is not told of --checkpoint-local-path")
args = launch.parse_args(BASE)
check(launch.spot_settings(args, "bkt", "job-1") == {}, "no --spot still sets spot fields")
check("checkpoint-dir" not in launch.hyperparameters(args), "no --spot still sets checkpoint-dir")
args = launch.parse_args(BASE + ["--checkpoint-s3", "s3://c/p"])
check("EnableManagedSpotTraining" not in launch.spot_settings(args, "b", "j"),
      "--checkpoint-s3 alone asks for spot capacity")
refused(["--spot", "--max-wait", "3600"], "must be more than --max-run 3600")
refused(["--max-wait", "9000"], "--max-wait needs --spot")
refused(["--spot", "--hp", "fresh=true"], "start over with a new --checkpoint-s3")
refused(["--spot", "--checkpoint-s3", "gs://x/y"], "expected s3://")
out = io.StringIO()
with contextlib.redirect_stdout(out):
    launch.main(BASE + ["--dry-run", "--spot"])
check('"EnableManagedSpotTraining": true' in out.getvalue() and
      '"MaxWaitTimeInSeconds": 7200' in out.getvalue(),
      "the dry run does not show the spot settings: %s" % out.getvalue())

for e in errors:
    print("FAILED:", e)
print("%d passed, %d failed" % (0 if errors else 1, 1 if errors else 0))
sys.exit(1 if errors else 0)
