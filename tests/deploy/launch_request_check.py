#!/usr/bin/env python3
"""deploy/sagemaker/launch.py's CreateTrainingJob requests against botocore's own SageMaker service
model (PyPI's botocore, offline): every member known, every required one there, each value of its
shape's type, within its min and max, matching its pattern and enum. Then what the script puts in
them: script mode's hyperparameters (the user's JSON-encoded as the SDK does, the entry point's
sagemaker_*, nothing else), the instance groups and channels as given, each channel to every
group. A request broken on purpose must fail the same check. Run with the Python of the venv
scripts/sagemaker-training-venv.sh makes (sagemaker-training brings boto3 and botocore).

usage: launch_request_check.py LAUNCH_PY
"""

import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile

import botocore
import botocore.session

spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)
model = botocore.session.get_session().get_service_model("sagemaker")
SHAPE = model.operation_model("CreateTrainingJob").input_shape


def problems(value, shape, where="request"):
    """What in `value` does not fit `shape`, one line each."""
    out = []
    meta = shape.metadata
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return ["%s: a %s, not a structure" % (where, type(value).__name__)]
        for name in shape.required_members:
            if name not in value:
                out.append("%s: %s is required" % (where, name))
        for name, v in value.items():
            if name not in shape.members:
                out.append("%s: %s is no member of %s" % (where, name, shape.name))
            else:
                out += problems(v, shape.members[name], "%s.%s" % (where, name))
    elif kind == "list":
        if not isinstance(value, list):
            return ["%s: a %s, not a list" % (where, type(value).__name__)]
        if len(value) < meta.get("min", 0) or len(value) > meta.get("max", len(value)):
            out.append("%s: %d items, outside [%s, %s]" % (where, len(value), meta.get("min"),
                                                           meta.get("max")))
        for i, v in enumerate(value):
            out += problems(v, shape.member, "%s[%d]" % (where, i))
    elif kind == "map":
        if not isinstance(value, dict):
            return ["%s: a %s, not a map" % (where, type(value).__name__)]
        if len(value) > meta.get("max", len(value)):
            out.append("%s: %d entries, over %d" % (where, len(value), meta["max"]))
        for k, v in value.items():
            out += problems(k, shape.key, "%s key %r" % (where, k))
            out += problems(v, shape.value, "%s[%r]" % (where, k))
    elif kind == "string":
        if not isinstance(value, str):
            return ["%s: a %s, not a string" % (where, type(value).__name__)]
        if len(value) < meta.get("min", 0) or len(value) > meta.get("max", len(value)):
            out.append("%s: %d characters, outside [%s, %s]" % (where, len(value),
                                                                meta.get("min"), meta.get("max")))
        if "pattern" in meta and not re.fullmatch(meta["pattern"], value, re.DOTALL):
            out.append("%s: %r does not match %s" % (where, value, meta["pattern"]))
        if shape.enum and value not in shape.enum:
            out.append("%s: %r is none of %s's values" % (where, value, shape.name))
    elif kind in ("integer", "long"):
        if not isinstance(value, int) or isinstance(value, bool):
            return ["%s: a %s, not an integer" % (where, type(value).__name__)]
        if value < meta.get("min", value) or value > meta.get("max", value):
            out.append("%s: %d outside [%s, %s]" % (where, value, meta.get("min"),
                                                    meta.get("max")))
    elif kind == "boolean":
        if not isinstance(value, bool):
            out.append("%s: a %s, not a boolean" % (where, type(value).__name__))
    return out


errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


def request(argv):
    args = launch.parse_args(argv)
    return launch.request(args, "sagemaker-eu-west-1-123456789012", "troupe-train-2026-12-02",
                          "eu-west-1")


BASE = ["--image", "123456789012.dkr.ecr.eu-west-1.amazonaws.com/troupe-train:latest",
        "--role", "arn:aws:iam::123456789012:role/SageMakerRole"]

with tempfile.TemporaryDirectory() as src:
    open(os.path.join(src, "train.py"), "w").close()
    open(os.path.join(src, "requirements.txt"), "w").close()
    cases = {
        "the seed's app": BASE + ["--data", "s3://bucket/fashion-mnist/"],
        "a script on 2 GPU instances and 2 data instances, spot": BASE + [
            "--entry-point", "train.py", "--source-dir", src,
            "--instance-group", "data_group=2:ml.c5.9xlarge",
            "--instance-group", "dnn_group=2:ml.g5.xlarge",
            "--channel", "train=s3://bucket/images/train", "--channel",
            "test=s3://bucket/images/test", "--hp", "epochs=3", "--hp", "batch-size=64",
            "--hyperparameters", '{"lr": 0.01, "layers": [256, 128]}', "--spot",
            "--head-group", "dnn_group"],
        "a script by its path, one group": BASE + [
            "--entry-point", os.path.join(src, "train.py"),
            "--instance-group", "homogeneousCluster=1:ml.p3.2xlarge"],
    }
    reqs = {}
    for name, argv in cases.items():
        reqs[name] = req = request(argv)
        for p in problems(req, SHAPE):
            errors.append("%s: %s" % (name, p))
        print("%s: %d members, checked against botocore %s's CreateTrainingJob"
              % (name, len(req), botocore.__version__))

    # What script mode asks for: the user's hyperparameters and the entry point's, nothing else.
    req = reqs["a script on 2 GPU instances and 2 data instances, spot"]
    hps = req["HyperParameters"]
    # --hp epochs=3 as the SDK's {"epochs": 3}: "3", not "\"3\"" (a string stays one).
    want = {"epochs": "3", "batch-size": "64", "lr": "0.01", "layers": "[256, 128]",
            "sagemaker_program": "\"train.py\"",
            "sagemaker_submit_directory": "\"s3://sagemaker-eu-west-1-123456789012/"
                                          "troupe-train-2026-12-02/source/sourcedir.tar.gz\"",
            "sagemaker_container_log_level": "20",
            "sagemaker_job_name": "\"troupe-train-2026-12-02\"",
            "sagemaker_region": "\"eu-west-1\"", "troupe_head_group": "dnn_group"}
    check(hps == want, "script mode's hyperparameters: %r, not %r" % (hps, want))
    check(req["ResourceConfig"]["InstanceGroups"] == [
        {"InstanceGroupName": "data_group", "InstanceType": "ml.c5.9xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "dnn_group", "InstanceType": "ml.g5.xlarge", "InstanceCount": 2}],
        "the instance groups: %r" % req["ResourceConfig"]["InstanceGroups"])
    by_name = {c["ChannelName"]: c["DataSource"]["S3DataSource"] for c in req["InputDataConfig"]}
    check(sorted(by_name) == ["test", "train", "troupe-secret"], "channels: %s" % sorted(by_name))
    check(all(d["InstanceGroupNames"] == ["data_group", "dnn_group"] for d in by_name.values()),
          "a channel not given to every group: %r" % by_name)
    check(reqs["a script by its path, one group"]["HyperParameters"]["sagemaker_program"] ==
          "\"train.py\"", "--entry-point by its path: the program is not its name in the folder")

    # Refused with the reason: what cannot become a valid request.
    for argv, says in (
            (["--entry-point", "nope.py", "--source-dir", src], "is not in --source-dir"),
            (["--instance-group", "dnn_group=0:ml.g5.xlarge"], "a count of at least 1"),
            (["--instance-group", "a=1:ml.c5.xlarge", "--head-group", "b"], "--head-group b"),
            (["--channel", "train=/local/path"], "expected NAME=s3://"),
            (["--hyperparameters", "[1]"], "must be a JSON object")):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                request(BASE + argv)
            errors.append("%s is accepted" % " ".join(argv))
        except SystemExit as e:
            check(says in str(e.code), "%s: refused with %r, not naming %r" % (argv, e.code, says))

    # The check itself fails a request that is wrong.
    broken = json.loads(json.dumps(req))
    broken["ResourceConfig"]["InstanceGroups"][0]["InstanceCount"] = "2"
    broken["StoppingCondition"]["MaxRuntimeInSeconds"] = 0
    broken["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3DataType"] = "Prefix"
    broken["TrainingJobName"] = "no_underscores"
    broken["Bogus"] = 1
    found = problems(broken, SHAPE)
    check(len(found) == 5, "a request broken 5 ways: the check found %d: %s" % (len(found), found))

for e in errors:
    print("FAILED:", e)
print("%s" % ("FAILED" if errors else "passed"))
sys.exit(1 if errors else 0)
