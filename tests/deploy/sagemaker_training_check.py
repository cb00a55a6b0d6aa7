#!/usr/bin/env python3
"""Optional real-world check: troupe reads resourceconfig.json and hyperparameters.json the way
SageMaker's own toolkit does.

Feeds the same emulated roots to PyPI's sagemaker-training (`Environment`) and to `troupe env`
(the functions troupe::run() uses) and compares current host, current group, hosts per group,
is-heterogeneous and the decoded hyperparameters. Run by ctest with the Python of the venv that
scripts/sagemaker-training-venv.sh makes; without sagemaker-training it fails (exit 1): a test
that cannot run is not a pass. It is never a dependency of troupe itself.

usage: sagemaker_training_check.py TROUPE_BINARY
"""

import json
import os
import subprocess
import sys
import tempfile

CASES = {
    # The seed's layout, host names shuffled across groups, group lists unsorted.
    "hetero": [
        {"current_host": host, "current_group_name": group, "current_instance_type": itype,
         "hosts": ["algo-1", "algo-2", "algo-3"], "network_interface_name": "eth0",
         "instance_groups": [
             {"instance_group_name": "data_group", "instance_type": "ml.c5.18xlarge",
              "hosts": ["algo-3", "algo-1"]},
             {"instance_group_name": "dnn_group", "instance_type": "ml.p4d.24xlarge",
              "hosts": ["algo-2"]}]}
        for host, group, itype in [("algo-1", "data_group", "ml.c5.18xlarge"),
                                   ("algo-2", "dnn_group", "ml.p4d.24xlarge"),
                                   ("algo-3", "data_group", "ml.c5.18xlarge")]],
    # A homogeneous job as SageMaker describes it today: one group named homogeneousCluster.
    "homogeneous": [
        {"current_host": "algo-2", "current_group_name": "homogeneousCluster",
         "current_instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2"],
         "network_interface_name": "eth0",
         "instance_groups": [{"instance_group_name": "homogeneousCluster",
                              "instance_type": "ml.c5.xlarge", "hosts": ["algo-2", "algo-1"]}]}],
}

HYPERPARAMETERS = {"epochs": "3", "layers": "[256, 128]", "name": "abc", "lr": "0.5",
                   "flag": "true", "nested": "{\"a\": [1, 2]}"}

TOOLKIT_VIEW = r"""
import json
from sagemaker_training import environment
env = environment.Environment()
print(json.dumps({
    "current_host": env.current_host,
    "current_group": env.current_instance_group,
    "groups": {g: sorted(d["hosts"]) for g, d in env.instance_groups_dict.items()},
    "is_heterogeneous": env.is_hetero,
    "hyperparameters": env.hyperparameters,
}))
"""


def toolkit_view(root):
    env = dict(os.environ, SAGEMAKER_BASE_DIR=root, AWS_DEFAULT_REGION="us-east-1")
    out = subprocess.run([sys.executable, "-c", TOOLKIT_VIEW], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def troupe_view(troupe, root):
    out = subprocess.run([troupe, "env", "--root", root], check=True, capture_output=True,
                         text=True).stdout
    t = json.loads(out)
    return {"current_host": t["current_host"], "current_group": t["current_group"],
            "groups": {g: sorted(d["hosts"]) for g, d in t["groups"].items()},
            "is_heterogeneous": t["is_heterogeneous"], "hyperparameters": t["hyperparameters"]}


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import sagemaker_training  # noqa: F401
    except ImportError:
        print("sagemaker_training_check: PyPI sagemaker-training is not importable by %s; make "
              "its venv with scripts/sagemaker-training-venv.sh VENV" % sys.executable)
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, configs in CASES.items():
            for rc in configs:
                root = os.path.join(tmp, name, rc["current_host"])
                config_dir = os.path.join(root, "input", "config")
                os.makedirs(config_dir)
                os.makedirs(os.path.join(root, "input", "data"))
                for fname, content in [("resourceconfig.json", rc),
                                       ("hyperparameters.json", HYPERPARAMETERS),
                                       ("inputdataconfig.json", {})]:
                    with open(os.path.join(config_dir, fname), "w") as f:
                        json.dump(content, f)
                theirs, ours = toolkit_view(root), troupe_view(sys.argv[1], root)
                for key in theirs:
                    if theirs[key] != ours[key]:
                        failures += 1
                        print("MISMATCH %s/%s %s: sagemaker-training %r, troupe %r"
                              % (name, rc["current_host"], key, theirs[key], ours[key]))
                print("%s/%s: %s" % (name, rc["current_host"],
                                     "agree" if theirs == ours else "differ"))
    print("%d passed, %d failed" % (0 if failures else 1, 1 if failures else 0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
