"""SageMaker script mode for deploy/sagemaker/train, as AWS's sagemaker-training toolkit runs it.

The SDK's estimators (`sagemaker.pytorch.PyTorch`, or `Estimator` with `entry_point` and
`source_dir`) upload the source folder as sourcedir.tar.gz and set two hyperparameters:
`sagemaker_program` (the entry point, e.g. "train.py") and `sagemaker_submit_directory` (where the
tarball is: s3://..., or file://... in local mode). The toolkit, in every AWS framework image,
then fetches the folder into /opt/ml/code, installs its requirements.txt, sets the SM_* variables
and runs `python train.py --epochs 3 ...` with the user's hyperparameters. `prepare()` does the
same here, so that a script written for script mode runs unchanged on every instance of a troupe
job, head and workers alike.

The SM_* values are the toolkit's (sagemaker-training 5.1.4, `Environment.to_env_vars()`; the
test tests/deploy/script_mode_check.py compares them with what the toolkit computes from the
same root), with three differences, each named where it is made: troupe's own `troupe_*`
hyperparameters are not the user's (never in SM_HPS, SM_USER_ARGS or the command line), and
SM_NUM_CPUS and SM_NUM_GPUS count what this process may use (its CPU affinity, and
CUDA_VISIBLE_DEVICES where set), which on SageMaker is the instance and under `troupe sim` is the
simulated instance's share.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

# The toolkit's own hyperparameters (sagemaker_training.params): never the user's, whatever
# their prefix.
TOOLKIT_KEYS = ("sagemaker_program", "sagemaker_submit_directory",
                "sagemaker_enable_cloudwatch_metrics", "sagemaker_region",
                "sagemaker_container_log_level", "sagemaker_job_name",
                "default_user_module_name", "_tuning_objective_metric", "sagemaker_s3_output")
# What turns on the toolkit's distribution instance groups (the current group is one).
DISTRIBUTED_KEYS = ("sagemaker_mpi_enabled", "sagemaker_parameter_server_enabled",
                    "sagemaker_distributed_dataparallel_enabled", "sagemaker_pytorch_ddp_enabled",
                    "sagemaker_pytorch_xla_multi_worker_enabled",
                    "sagemaker_multi_worker_mirrored_strategy_enabled",
                    "sagemaker_torch_distributed_enabled")


class ScriptModeError(Exception):
    """A script-mode job that cannot start: the message names the thing, its value and what to
    do."""


def split(hps):
    """(the user's hyperparameters, the toolkit's): the toolkit's are sagemaker_* and its own
    keys; troupe's troupe_* belong to neither (train reads them)."""
    user, toolkit = {}, {}
    for key, value in hps.items():
        if key in TOOLKIT_KEYS or key.startswith("sagemaker_"):
            toolkit[key] = value
        elif not key.startswith("troupe_"):
            user[key] = value
    return user, toolkit


def cmd_args(user):
    """The command line the toolkit gives the entry point: sorted keys, `--key value` (`-k` for a
    one-letter key), the names as given (no underscore becomes a dash), a mapping as k=v,k=v and
    anything else as Python's str() of the decoded value (so true arrives as True)."""
    out = []
    for key in sorted(user):
        name = str(key)
        out.append(("--%s" if len(name) > 1 else "-%s") % name if name else "")
        value = user[key]
        if hasattr(value, "items"):
            out.append(",".join("%s=%s" % (k, v) for k, v in sorted(value.items())))
        else:
            out.append("" if value is None else str(value))
    return out


def _read_json(path, default):
    if not os.path.exists(path):
        return default
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ScriptModeError("%s is not valid JSON: %s" % (path, e))


def _num_cpus():
    # This process's CPUs (sched_getaffinity): the instance's on SageMaker, the simulated
    # instance's under troupe sim (the toolkit counts the machine's).
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _num_gpus(environ):
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True,
                             timeout=30)
        found = sum(1 for line in out.stdout.split("\n") if line.startswith("GPU ")) \
            if out.returncode == 0 else 0
    except (OSError, subprocess.SubprocessError):
        found = 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # troupe sim hides the GPU from a CPU instance type this way (the toolkit ignores it).
        listed = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        found = min(found, len(listed))
    return found


def _env_value(value):
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def environment(root, hps, environ):
    """The SM_* variables, and the three the toolkit sets for itself (CURRENT_HOST,
    SAGEMAKER_JOB_NAME, SAGEMAKER_REGION), as sagemaker-training's Environment computes them
    from the root's config files and the decoded hyperparameters `hps`."""
    config = os.path.join(root, "input", "config")
    resource = _read_json(os.path.join(config, "resourceconfig.json"), None)
    if not isinstance(resource, dict) or "hosts" not in resource or "current_host" not in resource:
        raise ScriptModeError(
            "%s has no cluster (hosts and current_host): script mode needs SageMaker's (or troupe "
            "sim's) resourceconfig.json" % os.path.join(config, "resourceconfig.json"))
    input_data = _read_json(os.path.join(config, "inputdataconfig.json"), {})
    user, toolkit = split(hps)
    framework = {k: v for k, v in toolkit.items() if k not in TOOLKIT_KEYS}

    current_host = resource["current_host"]
    groups = resource.get("instance_groups", [])
    current_group = resource.get("current_group_name", "homogeneousCluster")
    group_hosts = next((g["hosts"] for g in groups if g["instance_group_name"] == current_group),
                       [])
    distribution_groups = framework.get("sagemaker_distribution_instance_groups")
    if distribution_groups is None:
        distribution_groups = [current_group] if any(framework.get(k, False)
                                                     for k in DISTRIBUTED_KEYS) else []
    if groups:
        distribution_hosts = [h for g in groups if g["instance_group_name"] in distribution_groups
                              for h in g["hosts"]]
    else:
        distribution_hosts = list(resource["hosts"])
    master = (distribution_hosts or resource["hosts"])[0]
    program = environ.get("SAGEMAKER_PROGRAM")
    if program is None:
        program = str(toolkit.get("sagemaker_program", None))
    entry_point = environ.get("SAGEMAKER_PROGRAM") or toolkit.get("sagemaker_program")
    module_dir = str(toolkit.get("sagemaker_submit_directory", os.path.join(root, "code")))
    mp = environ.get("SM_HP_MP_PARAMETERS")
    channels = {name: os.path.join(root, "input", "data", name) for name in input_data}
    output = os.path.join(root, "output")
    training = {
        "additional_framework_parameters": framework,
        "channel_input_dirs": channels,
        "current_host": current_host,
        "current_instance_group": current_group,
        "current_instance_group_hosts": group_hosts,
        "current_instance_type": resource.get("current_instance_type", "local"),
        "distribution_hosts": distribution_hosts,
        "distribution_instance_groups": distribution_groups,
        "framework_module": environ.get("SAGEMAKER_TRAINING_MODULE"),
        "hosts": resource["hosts"],
        "hyperparameters": user,
        "input_config_dir": config,
        "input_data_config": input_data,
        "input_dir": os.path.join(root, "input"),
        "instance_groups": [g["instance_group_name"] for g in groups],
        "instance_groups_dict": {g["instance_group_name"]: g for g in groups},
        "is_hetero": len(groups) > 1,
        "is_master": current_host == master,
        "is_modelparallel_enabled": mp and mp != "{}",
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
        "job_name": environ.get("TRAINING_JOB_NAME"),
        "log_level": toolkit.get("sagemaker_container_log_level", 20),
        "master_hostname": master,
        "model_dir": os.path.join(root, "model"),
        "module_dir": module_dir,
        "module_name": program[:-3] if program and program.endswith(".py") else program,
        "network_interface_name": resource.get("network_interface_name", "eth0"),
        "num_cpus": _num_cpus(),
        "num_gpus": _num_gpus(environ),
        "num_neurons": 0,
        "output_data_dir": os.path.join(output, "data"),
        "output_dir": output,
        "output_intermediate_dir": os.path.join(output, "intermediate"),
        "resource_config": resource,
        "topology": resource.get("topology", []),
        "user_entry_point": entry_point,
    }
    env = {key: training[key] for key in (
        "hosts", "network_interface_name", "user_entry_point", "resource_config",
        "input_data_config", "output_data_dir", "current_host", "current_instance_type",
        "current_instance_group", "current_instance_group_hosts", "instance_groups",
        "instance_groups_dict", "distribution_instance_groups", "is_hetero", "module_name",
        "log_level", "framework_module", "input_dir", "input_config_dir", "output_dir",
        "num_cpus", "num_gpus", "num_neurons", "model_dir", "module_dir",
        "output_intermediate_dir")}
    env.update(hps=user, framework_params=framework, channels=sorted(channels),
               training_env=training, user_args=cmd_args(user))
    if training["topology"]:
        env["topology"] = training["topology"]
    for name, path in channels.items():
        env["channel_%s" % name] = path
    for key, value in user.items():
        env["hp_%s" % key] = value
    out = {"SM_%s" % str(k).upper(): _env_value(v) for k, v in env.items()}
    region = toolkit.get("sagemaker_region") or environ.get("AWS_REGION") or \
        environ.get("AWS_DEFAULT_REGION") or ""
    out.update(CURRENT_HOST=current_host, SAGEMAKER_REGION=str(region),
               SAGEMAKER_JOB_NAME=str(toolkit.get("sagemaker_job_name", "")))
    return out


def _safe_extract(archive, dest):
    """Unpacks as tarfile's `data` filter does (Python 3.12; Debian 12's 3.11.2 lacks it): each
    member checked against the folder as unpacked so far, so that a symlink an earlier member made
    cannot lead a later one out (x/y -> ../w, then x/y/../../escaped.txt); no absolute path, no
    '..' out, no symlink or hardlink (its target taken from the folder's root, as tar resolves it)
    outside the folder, no device, FIFO or other special file; setuid, setgid, sticky and group or
    others' write bits dropped, and every file owned by the one unpacking it."""
    base = os.path.realpath(dest)

    def inside(path):
        return path == base or path.startswith(base + os.sep)

    def refuse(member, why):
        raise ScriptModeError("the source archive %s holds '%s', %s: refused"
                              % (archive, member.name, why))
    os.makedirs(base, exist_ok=True)
    with tarfile.open(archive, "r:*") as t:
        for m in t:
            if os.path.isabs(m.name) or m.name.startswith(("/", "\\")):
                refuse(m, "an absolute path")
            # realpath follows the links unpacked so far.
            target = os.path.realpath(os.path.join(base, m.name))
            if not inside(target):
                refuse(m, "outside the folder it unpacks into")
            if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                refuse(m, "a device, FIFO or other special file")
            if m.issym():
                if os.path.isabs(m.linkname):
                    refuse(m, "a symlink to the absolute path '%s'" % m.linkname)
                link = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))
                if not inside(link):
                    refuse(m, "a symlink to '%s', outside the folder it unpacks into"
                           % m.linkname)
            if m.islnk():
                # A hardlink's target is a path from the archive's root.
                link = os.path.realpath(os.path.join(base, m.linkname))
                if os.path.isabs(m.linkname) or not inside(link):
                    refuse(m, "a hardlink to '%s', outside the folder it unpacks into"
                           % m.linkname)
            m.mode &= 0o755  # no setuid, setgid, sticky, group or others' write
            if m.isreg():
                m.mode |= 0o600
            m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
            t.extract(m, base, numeric_owner=True)


def _s3_download(uri, dst):
    try:
        import boto3  # noqa: the image's, where it has one
    except ImportError:
        raise ScriptModeError(
            "hyperparameter sagemaker_submit_directory is %s, but this image's Python has no "
            "boto3 to fetch it: install boto3 in the image (pip install boto3), or give a local "
            "path or file:// URI" % uri)
    bucket, _, key = uri[len("s3://"):].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL"))
    try:
        s3.download_file(bucket, key, dst)
    except Exception as e:  # botocore's errors: one line, the URI named
        raise ScriptModeError("cannot fetch sagemaker_submit_directory %s: %s" % (uri, e))


def fetch(uri, code_dir):
    """The source folder into code_dir, as the toolkit's download_and_extract: only when code_dir
    is empty (SageMaker's local mode mounts the source there itself)."""
    os.makedirs(code_dir, exist_ok=True)
    if os.listdir(code_dir):
        return "already in %s" % code_dir
    if uri.startswith("s3://"):
        with tempfile.TemporaryDirectory() as tmp:
            archive = os.path.join(tmp, "sourcedir.tar.gz")
            _s3_download(uri, archive)
            _safe_extract(archive, code_dir)
        return "fetched from %s" % uri
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    if os.path.isdir(path):
        if os.path.realpath(path) != os.path.realpath(code_dir):
            shutil.rmtree(code_dir)
            shutil.copytree(path, code_dir)
        return "copied from %s" % path
    if os.path.isfile(path) and tarfile.is_tarfile(path):
        _safe_extract(path, code_dir)
        return "unpacked from %s" % path
    if os.path.isfile(path):
        shutil.copy2(path, code_dir)
        return "copied from %s" % path
    raise ScriptModeError(
        "hyperparameter sagemaker_submit_directory is '%s': no such file or folder; give the "
        "source folder, its sourcedir.tar.gz (a path or file:// URI) or an s3:// URI" % uri)


def install_requirements(code_dir, python):
    """pip install -r requirements.txt in code_dir with the script's Python, as the toolkit does;
    a failure names the file and pip's own error."""
    if not os.path.exists(os.path.join(code_dir, "requirements.txt")):
        return None
    # One pip at a time into one Python: troupe sim's instances share the machine's.
    import fcntl
    lock_path = os.path.join(tempfile.gettempdir(), "troupe-pip-%d.lock" % os.getuid())
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run([python, "-m", "pip", "install", "-r", "requirements.txt"],
                             cwd=code_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    sys.stderr.write(out.stdout)
    if out.returncode != 0:
        errors = [l.strip() for l in out.stdout.splitlines()
                  if l.strip().lower().startswith("error")]
        said = errors[0] if errors else (out.stdout.strip().splitlines() or ["no output"])[-1]
        if "externally-managed-environment" in out.stdout:
            said += (" (%s is a distribution's Python, which refuses pip installs, PEP 668: give "
                     "troupe_python a venv's, python3 -m venv --system-site-packages, or an "
                     "image's Python with its own pip)" % python)
        raise ScriptModeError("%s: pip install -r requirements.txt exited %d: %s"
                              % (os.path.join(code_dir, "requirements.txt"), out.returncode, said))
    return "requirements.txt installed"


def _missing(program, code_dir):
    """The refusal of an entry point the source folder lacks: what it has, and the nearest
    name."""
    import difflib
    have = sorted(os.listdir(code_dir))
    near = difflib.get_close_matches(program, have, n=1)
    return ScriptModeError("hyperparameter sagemaker_program '%s': no such file in the source "
                           "folder %s (it has: %s)%s"
                           % (program, code_dir, ", ".join(have) or "nothing",
                              "; did you mean %s?" % near[0] if near else ""))


def check_program(code_dir, program):
    """The entry point is in the fetched source, before pip runs on every instance: a file (a
    folder with setup.py runs it as a module, as the toolkit does)."""
    path = os.path.realpath(os.path.join(code_dir, program))
    if not path.startswith(os.path.realpath(code_dir) + os.sep):
        raise ScriptModeError("hyperparameter sagemaker_program '%s' is outside the source folder "
                              "%s" % (program, code_dir))
    if "setup.py" in os.listdir(code_dir) and not program.endswith(".sh"):
        return  # a module of the package pip installs (command())
    if not os.path.isfile(path):
        raise _missing(program, code_dir)


def command(code_dir, program, python, user):
    """The entry point's command line, by its kind (the toolkit's _entry_point_type): a .sh or
    other file runs itself, a folder with setup.py is pip-installed and run as a module, a .py
    runs under python."""
    args = cmd_args(user)
    path = os.path.realpath(os.path.join(code_dir, program))
    if not path.startswith(os.path.realpath(code_dir) + os.sep):
        raise ScriptModeError("hyperparameter sagemaker_program '%s' is outside the source folder "
                              "%s" % (program, code_dir))
    if program.endswith(".sh") or (not program.endswith(".py") and
                                   "setup.py" not in os.listdir(code_dir)):
        if not os.path.isfile(path):
            raise _missing(program, code_dir)
        os.chmod(path, 0o755)
        # A .sh runs under /bin/sh as the toolkit runs it (no #! line needed); another file
        # runs itself.
        return (["/bin/sh", path] if program.endswith(".sh") else [path]) + args
    if "setup.py" in os.listdir(code_dir):
        out = subprocess.run([python, "-m", "pip", "install", "."], cwd=code_dir)
        if out.returncode != 0:
            raise ScriptModeError("%s: pip install . exited %d (its output above)"
                                  % (os.path.join(code_dir, "setup.py"), out.returncode))
        module = program[:-3] if program.endswith(".py") else program
        return [python, "-m", module] + args
    if not os.path.isfile(path):
        raise _missing(program, code_dir)
    return [python, path] + args
