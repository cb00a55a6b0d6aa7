#!/usr/bin/env python3
"""deploy/sagemaker/script_mode.py's SM_* variables against PyPI's sagemaker-training's own.

For each emulated SageMaker root (a heterogeneous cluster with train and test channels, a
homogeneous one, DDP turned on by the SDK's distribution flag, distribution instance groups given
by name), the toolkit's `Environment().to_env_vars()` and the CURRENT_HOST, SAGEMAKER_JOB_NAME and
SAGEMAKER_REGION it sets, computed in a process of its own, must equal what
script_mode.environment() computes from the same root, variable by variable, and the command
line must be the toolkit's `to_cmd_args()`. troupe's own troupe_* hyperparameters are added to
troupe's side only: they must change nothing. SM_NUM_CPUS is troupe's CPU affinity, the
toolkit's the machine's CPU count: each is checked against its own. Run with the Python of the
venv scripts/sagemaker-training-venv.sh makes; without sagemaker-training it fails.

usage: script_mode_check.py SOURCE_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

TOOLKIT = r"""
import json, os
from sagemaker_training import environment
env = environment.Environment()
out = env.to_env_vars()
for name in ("CURRENT_HOST", "SAGEMAKER_JOB_NAME", "SAGEMAKER_REGION"):
    out[name] = os.environ.get(name)
print(json.dumps({"env": out, "args": env.to_cmd_args(), "cpus": os.cpu_count()}))
"""

HETERO = {"current_host": "algo-3", "current_group_name": "data_group",
          "current_instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2", "algo-3"],
          "network_interface_name": "eth0",
          "instance_groups": [
              {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge",
               "hosts": ["algo-1"]},
              {"instance_group_name": "data_group", "instance_type": "ml.c5.xlarge",
               "hosts": ["algo-3", "algo-2"]}]}
HOMOGENEOUS = {"current_host": "algo-2", "current_group_name": "homogeneousCluster",
               "current_instance_type": "ml.g5.xlarge", "hosts": ["algo-1", "algo-2"],
               "network_interface_name": "eth0",
               "instance_groups": [{"instance_group_name": "homogeneousCluster",
                                    "instance_type": "ml.g5.xlarge",
                                    "hosts": ["algo-1", "algo-2"]}]}
CHANNEL = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
           "RecordWrapperType": "None"}
# As the SDK writes them: every value a JSON string.
USER = {"epochs": "3", "batch_size": "64", "lr": "0.01", "flag": "true", "name": "abc",
        "layers": "[256, 128]", "nested": "{\"b\": 2, \"a\": [1, 2]}", "k": "5",
        "data-dir": "\"/opt/ml/input/data/train\"", "quoted": "\"a b\""}
SDK = {"sagemaker_program": "\"train.py\"",
       "sagemaker_submit_directory": "\"s3://bucket/job/source/sourcedir.tar.gz\"",
       "sagemaker_region": "\"eu-west-1\"", "sagemaker_job_name": "\"job-1\"",
       "sagemaker_container_log_level": "20"}
CASES = {
    "hetero": (HETERO, {"train": CHANNEL, "test": CHANNEL}, dict(USER, **SDK)),
    "homogeneous": (HOMOGENEOUS, {"training": CHANNEL}, dict(USER, **SDK)),
    "ddp": (HOMOGENEOUS, {"train": CHANNEL},
            dict(USER, sagemaker_pytorch_ddp_enabled="true", **SDK)),
    "groups": (HETERO, {"train": CHANNEL},
               dict(USER, sagemaker_distribution_instance_groups="[\"data_group\"]",
                    sagemaker_torch_distributed_enabled="true", **SDK)),
    "bare": (HOMOGENEOUS, {}, {"sagemaker_program": "\"run.sh\""}),
}
TROUPE_ONLY = {"troupe_node_restarts": "2", "troupe_log_level": "\"debug\""}


def decode(value):
    try:
        return json.loads(value)
    except ValueError:
        return value


def main():
    source = sys.argv[1]
    sys.path.insert(0, os.path.join(source, "deploy", "sagemaker"))
    import script_mode
    failures = 0
    for name, (resource, channels, hps) in CASES.items():
        with tempfile.TemporaryDirectory() as root:
            config = os.path.join(root, "input", "config")
            os.makedirs(config)
            for file, content in (("resourceconfig.json", resource),
                                  ("inputdataconfig.json", channels),
                                  ("hyperparameters.json", hps)):
                with open(os.path.join(config, file), "w") as f:
                    json.dump(content, f)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CUDA_VISIBLE_DEVICES", "SAGEMAKER_PROGRAM", "TRAINING_JOB_NAME",
                                "SM_HP_MP_PARAMETERS", "SAGEMAKER_TRAINING_MODULE")}
            env.update(SAGEMAKER_BASE_DIR=root, AWS_DEFAULT_REGION="us-east-1")
            out = subprocess.run([sys.executable, "-c", TOOLKIT], env=env, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                print("FAILED: %s: the toolkit exited %d:\n%s" % (name, out.returncode, out.stderr))
                return 1
            toolkit = json.loads(out.stdout.strip().splitlines()[-1])
            decoded = {k: decode(v) for k, v in dict(hps, **TROUPE_ONLY).items()}
            ours = script_mode.environment(root, decoded, env)
            user, _ = script_mode.split(decoded)
            theirs = toolkit["env"]
            # The CPU count: each side against its own source.
            cpus = len(os.sched_getaffinity(0))
            checks = [("SM_NUM_CPUS (toolkit: os.cpu_count())", theirs.pop("SM_NUM_CPUS"),
                       str(toolkit["cpus"])),
                      ("SM_NUM_CPUS (troupe: the CPU affinity)", ours.pop("SM_NUM_CPUS"),
                       str(cpus))]
            t_env, o_env = json.loads(theirs.pop("SM_TRAINING_ENV")), \
                json.loads(ours.pop("SM_TRAINING_ENV"))
            checks.append(("SM_TRAINING_ENV num_cpus", (t_env.pop("num_cpus"),
                                                        o_env.pop("num_cpus")),
                           (toolkit["cpus"], cpus)))
            checks.append(("SM_TRAINING_ENV", o_env, t_env))
            for key in sorted(set(theirs) | set(ours)):
                checks.append((key, ours.get(key), theirs.get(key)))
            checks.append(("the command line", script_mode.cmd_args(user), toolkit["args"]))
            bad = [(what, got, want) for what, got, want in checks if got != want]
            for what, got, want in bad:
                if isinstance(got, dict) and isinstance(want, dict):  # the keys that differ
                    keys = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                    got, want = ({k: d.get(k) for k in keys} for d in (got, want))
                print("FAILED: %s: %s: troupe %r, sagemaker-training %r" % (name, what, got, want))
            failures += len(bad)
            print("%s: %d variables and the command line as sagemaker-training's%s"
                  % (name, len(theirs) + 2, "" if not bad else " - %d differ" % len(bad)))
    # A source archive that would write outside /opt/ml/code is refused, naming the member.
    import io
    import tarfile
    for member, kind in (("../evil.py", "file"), ("link", "symlink")):
        with tempfile.TemporaryDirectory() as tmp:
            archive = os.path.join(tmp, "sourcedir.tar.gz")
            with tarfile.open(archive, "w:gz") as t:
                info = tarfile.TarInfo(member)
                if kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                    t.addfile(info)
                else:
                    info.size = 1
                    t.addfile(info, io.BytesIO(b"x"))
            try:
                script_mode.fetch("file://" + archive, os.path.join(tmp, "code"))
                print("FAILED: an archive with %s %s outside the code folder was unpacked"
                      % (kind, member))
                failures += 1
            except script_mode.ScriptModeError as e:
                if member not in str(e) or "refused" not in str(e):
                    print("FAILED: the refusal does not name %s: %s" % (member, e))
                    failures += 1
            if os.path.exists(os.path.join(tmp, "evil.py")):
                print("FAILED: ../evil.py was written")
                failures += 1
    # Crafted as tarfile's `data` filter refuses them (issue 62): a symlink chain that a later
    # member walks out through, a hardlink whose target (a path from the archive's root) is
    # outside, an absolute path, a device; and a setuid file with another owner, unpacked
    # without either.
    def member(name, kind="file", link="", mode=0o644, data=b"x", uid=0):
        info = tarfile.TarInfo(name)
        info.mode, info.uid, info.uname = mode, uid, "someone"
        if kind == "file":
            info.size = len(data)
            return info, io.BytesIO(data)
        info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                     "dir": tarfile.DIRTYPE, "device": tarfile.CHRTYPE}[kind]
        info.linkname = link
        return info, None
    crafted = {
        "a symlink chain walked out of": [member("x", "dir", mode=0o755),
                                          member("w", "dir", mode=0o755),
                                          member("x/y", "symlink", "../w"),
                                          member("x/y/../../escaped.txt")],
        "a hardlink out": [member("a/b", "dir", mode=0o755), member("a/b/c", "hardlink",
                                                                   "../secret.txt")],
        "an absolute path": [member("/tmp/troupe-absolute.txt")],
        "a device": [member("dev", "device")],
    }
    for name, members in crafted.items():
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "secret.txt"), "w") as f:
                f.write("secret")
            archive = os.path.join(tmp, "sourcedir.tar.gz")
            with tarfile.open(archive, "w:gz") as t:
                for info, data in members:
                    t.addfile(info, data)
            code = os.path.join(tmp, "code")
            try:
                script_mode.fetch("file://" + archive, code)
                print("FAILED: %s: the archive was unpacked" % name)
                failures += 1
            except script_mode.ScriptModeError as e:
                if "refused" not in str(e):
                    print("FAILED: %s: %s" % (name, e))
                    failures += 1
            escaped = [p for p in (os.path.join(tmp, "escaped.txt"), "/tmp/troupe-absolute.txt")
                       if os.path.exists(p)]
            if escaped or os.path.exists(os.path.join(code, "a", "b", "c")):
                print("FAILED: %s: written outside, or linked from outside: %s" % (name, escaped))
                failures += 1
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "sourcedir.tar.gz")
        with tarfile.open(archive, "w:gz") as t:
            for info, data in (member("bin", "dir", mode=0o755),
                               member("bin/run.sh", mode=0o4777, uid=4242),
                               member("train.py", mode=0o666)):
                t.addfile(info, data)
        code = os.path.join(tmp, "code")
        script_mode.fetch("file://" + archive, code)
        st = os.stat(os.path.join(code, "bin", "run.sh"))
        if st.st_mode & 0o7022 or st.st_uid != os.getuid():
            print("FAILED: setuid or others' write kept, or the owner: mode %o, uid %d"
                  % (st.st_mode, st.st_uid))
            failures += 1
    print("hostile archives: a member outside the code folder, a link out of it, a symlink chain "
          "walked out of, a hardlink out, an absolute path and a device refused; setuid and "
          "owners dropped")
    if any(k.startswith("SM_HP_TROUPE") for k in ours) or "troupe_node_restarts" in str(
            script_mode.cmd_args(user)):
        print("FAILED: a troupe_* hyperparameter reached the script")
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
