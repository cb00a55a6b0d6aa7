#!/usr/bin/env python3
"""make test-image: the SageMaker image, run as SageMaker runs it.

Three containers algo-1..3 on one container network, each with its hostname, its own /opt/ml
root (resourceconfig.json with the groups' hosts unsorted, hyperparameters.json with string
values, a `train` channel, the job secret as the channel troupe-secret with mode 0400), started
with the command `train`, as `docker run IMAGE train` is on SageMaker. Exit statuses come from
the container engine, outcome files and the report from the roots the containers wrote.

Cases (each prints one line, PASS or FAIL with why):
  job           a normal job: exit 0 everywhere, output/success everywhere, the model and
                report.json on the head (output/data/ is not made beforehand: the app makes it),
                every sample of every epoch trained exactly once (the report)
  secret        the secret appears in no `inspect`, environment, log or output file
  stop          `stop --time 120` of every container mid-training (after a seeded number of
                steps): exit 6 everywhere, output/failure naming the stop, a stop checkpoint;
                then the job again on new containers (hosts dealt again) with SageMaker's copy of
                the checkpoints: exit 0, resumed from it, every sample exactly once across both
  early-stop    `stop` within 0.1 s of each container's start: exit 6 with output/failure on
                every instance, never ignored
  kill-data     SIGKILL of a data container mid-training: the job completes, exactly once
  kill-app      SIGKILL of the app under `train` in a data container: train starts it again, it
                rejoins, every container exits 0, exactly once
  broken-image  the same job in a copy of the image without libcapnp-rpc: the job case must
                fail on it (the check can fail)
  pytorch-job   a PyTorch script in script mode (tests/image/pytorch/train.py, shipped as the SDK
                ships it: sourcedir.tar.gz with a requirements.txt, named by
                sagemaker_submit_directory; SageMaker's hyperparameters as the SDK writes them),
                with SIGKILL to the app under `train` in a data container mid-epoch: train starts
                it again, every container exits 0, the model on the head, and every sample of
                every epoch trained exactly once (the ids the script trained on, counted here)
  pytorch-stop  the same job, `stop --time 120` of every container mid-epoch: exit 6 everywhere,
                output/failure naming the stop, the script's state in /opt/ml/checkpoints; then
                the job again from SageMaker's copy of it: exit 0 everywhere, every sample of
                every epoch exactly once across both runs
  The pytorch-* cases need the PyTorch image (`make image`, IMAGE_TORCH=on, the default); on an
  image built with IMAGE_TORCH=off each is reported as a skip with that reason.

Usage: image_test.py [--image NAME] [--seed N] [--case NAME ...]. Exit 0 when every case passed;
exit 77 with one line when no container engine can run here (a skip, not a pass).
"""

import argparse
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATASET = "/usr/share/datasets/fashion-mnist"
SKIP = 77
INTERRUPTED = 6  # troupe/exit_codes.h

TRAIN_SAMPLES = 6000
EPOCHS = 2
HYPERPARAMETERS = {  # as SageMaker writes them: every value a string; both spellings of names
    "epochs": str(EPOCHS),
    "train_samples": str(TRAIN_SAMPLES),
    "batch_size": "64",
    "blur": "3",
    "progress-every": "0.2",
    "augmenters-per-node": "2",
    "checkpoint_every": "0",
}


class Engine:
    def __init__(self):
        out = subprocess.run([os.path.join(REPO, "scripts", "container-engine.sh")],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(skip(out.stderr.strip().splitlines()[-1] if out.stderr.strip()
                                  else "no container engine"))
        self.env = dict(os.environ)
        for line in out.stdout.splitlines():
            key, _, value = line.partition("=")
            if key == "ENGINE":
                self.name = value
            elif key:
                self.env[key] = value

    def run(self, *args, check=True, timeout=300):
        p = subprocess.run([self.name, *args], capture_output=True, text=True, env=self.env,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError("%s %s: exit %d: %s" % (self.name, " ".join(args), p.returncode,
                                                       p.stderr.strip()[-400:]))
        return p


def skip(reason):
    print("SKIP: image test: " + reason, flush=True)
    return SKIP


class Cluster:
    """Three SageMaker instances as containers; `layout` maps host -> group."""

    GROUPS = {"data_group": "ml.c5.xlarge", "dnn_group": "ml.p3.2xlarge"}

    def __init__(self, engine, image, network, work, name, layout, checkpoints=None, hps=None,
                 source=None):
        # The network's own DNS server only (its gateway): the host's resolvers, which the engine
        # also lists, are unreachable from an internal network, and a lookup that reaches them
        # waited 20 s to fail while the names were being registered.
        self.engine, self.image, (self.network, self.dns) = engine, image, network
        self.name = name
        self.layout = layout
        self.hosts = sorted(layout)
        self.head = next(h for h in self.hosts if layout[h] == "dnn_group")
        self.secret = secrets.token_hex(16)
        self.dir = os.path.join(work, name)
        self.containers = {h: "troupe-it-%d-%s-%s" % (os.getpid(), name, h) for h in self.hosts}
        self.hps = hps or HYPERPARAMETERS
        for host in self.hosts:
            self._root(host, checkpoints, source)

    def root(self, host):
        return os.path.join(self.dir, host)

    def _root(self, host, checkpoints, source):
        root = self.root(host)
        config = os.path.join(root, "input", "config")
        os.makedirs(config)
        groups = []
        for group, itype in self.GROUPS.items():
            members = [h for h in self.hosts if self.layout[h] == group]
            members.reverse()  # unsorted, as SageMaker may list them
            groups.append({"instance_group_name": group, "instance_type": itype,
                           "hosts": members})
        with open(os.path.join(config, "resourceconfig.json"), "w") as f:
            json.dump({"current_host": host, "current_group_name": self.layout[host],
                       "current_instance_type": self.GROUPS[self.layout[host]],
                       "hosts": self.hosts, "instance_groups": groups,
                       "network_interface_name": "eth0"}, f)
        with open(os.path.join(config, "hyperparameters.json"), "w") as f:
            json.dump(self.hps, f)
        with open(os.path.join(config, "inputdataconfig.json"), "w") as f:
            json.dump({"train": {"TrainingInputMode": "File"},
                       "troupe-secret": {"TrainingInputMode": "File"}}, f)
        shutil.copytree(DATASET, os.path.join(root, "input", "data", "train"))
        secret_dir = os.path.join(root, "input", "data", "troupe-secret")
        os.makedirs(secret_dir)
        secret_file = os.path.join(secret_dir, "secret")
        with open(secret_file, "w") as f:
            f.write(self.secret + "\n")
        os.chmod(secret_file, 0o400)
        for d in ("model", "output", "checkpoints"):  # not output/data: the app makes it
            os.makedirs(os.path.join(root, d))
        if source:  # the estimator's source_dir as the SDK uploads it (local mode: a file:// URI)
            os.makedirs(os.path.join(root, "source"))
            shutil.copy2(source, os.path.join(root, "source", "sourcedir.tar.gz"))
        if checkpoints:  # SageMaker copies checkpoint_s3_uri into every instance's folder
            for f in os.listdir(checkpoints):
                shutil.copy2(os.path.join(checkpoints, f), os.path.join(root, "checkpoints"))

    def create(self):
        for host in self.hosts:
            self.engine.run("create", "--name", self.containers[host], "--hostname", host,
                            "--network", self.network, "--network-alias", host,
                            "--dns", self.dns, "--dns-option", "timeout:1",
                            "-v", "%s:/opt/ml" % self.root(host), self.image, "train")

    def start(self, hosts=None):
        # The head first. The first container to start on a fresh podman network sometimes gets
        # no answer from the network's DNS server (aardvark-dns, started with it) for 30-50 s
        # (seen here: "Temporary failure in name resolution" every 2 s while the others resolved
        # at once); the workers' joins retry through that, but it ate most of the join timeout.
        # The head looks no name up.
        hosts = sorted(hosts or self.hosts, key=lambda h: h != self.head)
        for host in hosts:
            self.engine.run("start", self.containers[host])

    def logs(self, host):
        p = self.engine.run("logs", self.containers[host], check=False)
        return p.stdout + p.stderr

    def wait_for_step(self, step, timeout=180):
        """Until the head's log shows a progress line at or past `step` of epoch 1."""
        deadline = time.time() + timeout
        pattern = re.compile(r"progress: epoch (\d+)/\d+, step (\d+)/")
        while time.time() < deadline:
            for m in pattern.finditer(self.logs(self.head)):
                if int(m.group(1)) > 1 or int(m.group(2)) >= step:
                    return True
            state = self.engine.run("inspect", "--format", "{{.State.Running}}",
                                    self.containers[self.head], check=False).stdout.strip()
            if state == "false":
                return False
            time.sleep(0.1)
        return False

    def wait(self, timeout=300):
        """Exit status of every container, read from the engine."""
        codes = {}
        deadline = time.time() + timeout
        for host in self.hosts:
            left = max(1, deadline - time.time())
            p = self.engine.run("wait", self.containers[host], check=False, timeout=left + 10)
            code = self.engine.run("inspect", "--format", "{{.State.ExitCode}}",
                                   self.containers[host]).stdout.strip()
            codes[host] = int(code) if code.lstrip("-").isdigit() else p.stdout.strip()
        return codes

    def stop(self, hosts, seconds=120):
        threads = [threading.Thread(target=self.engine.run, args=(
            "stop", "--time", str(seconds), self.containers[h]), kwargs={"check": False})
            for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def file(self, host, *path):
        p = os.path.join(self.root(host), *path)
        if not os.path.exists(p):
            return None
        with open(p, errors="replace") as f:
            return f.read()

    def remove(self):
        for c in self.containers.values():
            self.engine.run("rm", "-f", "-t", "0", c, check=False)


def container_init(cid):
    """The host PID of the container `cid`'s first process (its PID 1), or None yet."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cgroup" % name) as f:
                if cid not in f.read():
                    continue
            with open("/proc/%s/status" % name) as f:
                status = f.read()
        except OSError:
            continue
        m = re.search(r"^NSpid:\s+\d+\s+1$", status, re.M)  # PID 1 in its own namespace
        if m:
            return int(name)
    return None


def comm_of(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def sigterm_blocked(pid):
    """Whether process `pid` blocks SIGTERM (its SigBlk mask in /proc)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            m = re.search(r"^SigBlk:\s+([0-9a-f]+)$", f.read(), re.M)
    except OSError:
        return False
    return bool(m) and (int(m.group(1), 16) >> 14) & 1 == 1


# docs/hetero_train.md's digest of an epoch that trained on ids 0 .. samples - 1 once each
# (tests/support/digest.h), computed from the ids alone, so the check does not trust the trainer's
# own counters: the GPU check's copy.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from gpu_check_parts import digest as every_id_once  # noqa: E402
from pytorch_cases import PytorchCases, Skip  # noqa: E402


def exactly_once(report, samples=TRAIN_SAMPLES, epochs=EPOCHS):
    """Why the report's epochs are not each sample exactly once, or None."""
    if report is None:
        return "no report.json"
    r = json.loads(report)
    got = r.get("epochs", [])
    if len(got) != epochs:
        return "the report has %d epochs, not %d" % (len(got), epochs)
    for e in got:
        if (e["samples"], e["duplicates"], e["missing"]) != (samples, 0, 0):
            return "epoch %d: %d samples, %d duplicates, %d missing (want %d, 0, 0)" % (
                e["epoch"], e["samples"], e["duplicates"], e["missing"], samples)
        if e.get("digest") != every_id_once(samples):
            return "epoch %d: digest %s, not %s (every id below %d once)" % (
                e["epoch"], e.get("digest"), every_id_once(samples), samples)
    return None


class Run(PytorchCases):
    def __init__(self, args, engine):
        self.args, self.engine = args, engine
        self.rng = random.Random(args.seed)
        self.work = tempfile.mkdtemp(prefix="troupe-image-test-")
        self.networks = []
        self.clusters = []
        self.third = 20 + os.getpid() % 200

    def network(self, name):
        """A network of its own for each job, as each SageMaker job has: internal (no route out),
        on a subnet of the test's own. (Jobs sharing one network would share the names algo-N,
        and a name could still lead to a stopped container of an earlier job.)"""
        network = "troupe-it-%d-%s" % (os.getpid(), name)
        for _ in range(256):
            self.third = 20 + (self.third - 19) % 230
            p = self.engine.run("network", "create", "--internal", "--subnet",
                                "10.214.%d.0/24" % self.third, "--gateway",
                                "10.214.%d.1" % self.third, network, check=False)
            if p.returncode == 0:
                self.networks.append(network)
                return network, "10.214.%d.1" % self.third
        raise RuntimeError("cannot create a container network: " + p.stderr)

    def cluster(self, name, image=None, layout=None, checkpoints=None, hps=None, source=None):
        layout = layout or {"algo-1": "data_group", "algo-2": "dnn_group",
                            "algo-3": "data_group"}
        network, dns = self.network(name)
        c = Cluster(self.engine, image or self.args.image, (network, dns), self.work, name,
                    layout, checkpoints, hps, source)
        self.clusters.append(c)
        t = time.time()
        c.create()
        if time.time() - t > 5:
            print("  %s: creating the containers took %.1f s" % (name, time.time() - t), flush=True)
        return c

    def close(self):
        for c in self.clusters:
            c.remove()
        for network in self.networks:
            self.engine.run("network", "rm", "-f", network, check=False)
        shutil.rmtree(self.work, ignore_errors=True)

    # -- cases: each returns None when it passed, else why not --

    def job(self, image=None):
        c = self.cluster("job" if image is None else "broken", image)
        c.start()
        codes = c.wait()
        c.codes = codes
        self.last_job = c
        if any(codes.values()):
            return "exit statuses %s, want 0 everywhere; the head's log ends: %s" % (
                codes, c.logs(c.head)[-600:])
        for h in c.hosts:
            if c.file(h, "output", "success") is None:
                return "%s wrote no output/success" % h
        if not os.listdir(os.path.join(c.root(c.head), "model")):
            return "no model in the head's /opt/ml/model"
        return exactly_once(c.file(c.head, "output", "data", "report.json"))

    def secret(self):
        c = getattr(self, "last_job", None) or self.cluster("secret")
        if c.name != "job":
            c.start()
            c.codes = c.wait()
        # A job that did not run to the end may never have read the secret: its silence proves
        # nothing.
        if any(c.codes.values()):
            return ("the job it inspects ended with exit statuses %s, not 0 everywhere: no "
                    "evidence either way" % c.codes)
        places = []
        for h in c.hosts:
            inspect = self.engine.run("inspect", c.containers[h]).stdout
            if c.secret in inspect:
                places.append("%s: inspect (its environment included)" % h)
            if c.secret in c.logs(h):
                places.append("%s: its log" % h)
            for sub in ("output", "model", "checkpoints"):
                for dirpath, _, files in os.walk(os.path.join(c.root(h), sub)):
                    for f in files:
                        with open(os.path.join(dirpath, f), "rb") as fh:
                            if c.secret.encode() in fh.read():
                                places.append(os.path.join(dirpath, f))
        return "the secret appears in " + ", ".join(places) if places else None

    def stop(self):
        step = self.rng.randint(3, 30)
        print("  stop: every container stopped at step %d of epoch 1 (--seed %d)" % (
            step, self.args.seed), flush=True)
        c = self.cluster("stop")
        t = time.time()
        c.start()
        reached = c.wait_for_step(step)
        print("  stop: step %d reached %.1f s after the start" % (step, time.time() - t), flush=True)
        if not reached:
            return "training never reached step %d; the head's log ends: %s" % (
                step, c.logs(c.head)[-600:])
        t = time.time()
        c.stop(c.hosts)
        codes = c.wait()
        print("  stop: every container exited %.1f s after the stop: %s" % (time.time() - t, codes),
              flush=True)
        if any(code != INTERRUPTED for code in codes.values()):
            return "exit statuses %s after the stop, want %d everywhere" % (codes, INTERRUPTED)
        for h in c.hosts:
            failure = c.file(h, "output", "failure")
            if failure is None or "SIGTERM" not in failure:
                return "%s: output/failure is %r; it should name the stop (SIGTERM)" % (h, failure)
        saved = os.path.join(self.work, "checkpoint-s3")  # what SageMaker uploads, all hosts
        os.makedirs(saved)
        for h in c.hosts:
            for f in os.listdir(os.path.join(c.root(h), "checkpoints")):
                shutil.copy2(os.path.join(c.root(h), "checkpoints", f), saved)
        if not any(f.endswith(".troupe") for f in os.listdir(saved)):
            return "no stop checkpoint in any /opt/ml/checkpoints: %s" % os.listdir(saved)
        # Started again on new instances: the groups dealt to other hosts.
        r = self.cluster("resume", layout={"algo-1": "dnn_group", "algo-2": "data_group",
                                           "algo-3": "data_group"}, checkpoints=saved)
        t = time.time()
        r.start()
        codes = r.wait()
        print("  stop: the resumed job took %.1f s" % (time.time() - t), flush=True)
        if any(codes.values()):
            return "the resumed job exited %s, want 0 everywhere; its head's log ends: %s" % (
                codes, r.logs(r.head)[-600:])
        report = r.file(r.head, "output", "data", "report.json")
        why = exactly_once(report)
        if why:
            return "resumed job: " + why
        if not json.loads(report).get("resumed_from"):
            return "the resumed job's report names no checkpoint it resumed from"
        return None

    def early_stop(self):
        """A stop at the very start of each container: SIGTERM to its PID 1 from the host (what
        `stop` does: the OCI runtime's kill(2) of the container's init) the moment that process
        is first seen, before or while the entry point execs `train` and the app."""
        c = self.cluster("early")
        landed = {}
        for host in c.hosts:
            cid = self.engine.run("inspect", "--format", "{{.Id}}",
                                  c.containers[host]).stdout.strip()
            starter = subprocess.Popen([self.engine.name, "start", c.containers[host]],
                                       env=self.engine.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
            pid, seen = None, time.time()
            while pid is None and time.time() - seen < 60:
                pid = container_init(cid)
            if pid is None:
                starter.kill()
                return "%s: its process never appeared" % host
            # From the entry point's first instruction (it blocks SIGTERM there): before it, in
            # the microseconds between the OCI runtime's exec and that instruction, the kernel
            # drops a SIGTERM to a PID 1 that has no handler, and no entry point can help that.
            # (The OCI runtime's own init, runc:[2:INIT], blocks signals too, but not across its
            # exec of the entry point: a stop that reaches it is not a started container's.)
            while not (sigterm_blocked(pid) and not comm_of(pid).startswith("runc")) \
                    and time.time() - seen < 60:
                pass
            try:
                comm = open("/proc/%d/comm" % pid).read().strip()
            except OSError:
                return "%s: its first process ended before the stop" % host
            os.kill(pid, signal.SIGTERM)  # raises if the process is gone: the injection did not happen
            landed[host] = comm
            starter.wait()
        codes = c.wait()
        print("  early-stop: SIGTERM to PID 1 from its first instruction on, while it was %s" % (
            ", ".join("%s: %s" % hc for hc in sorted(landed.items()))), flush=True)
        if any(code != INTERRUPTED for code in codes.values()):
            return "exit statuses %s, want %d everywhere (a stop was ignored or lost); %s" % (
                codes, INTERRUPTED, c.logs(c.head)[-400:])
        for h in c.hosts:
            if c.file(h, "output", "failure") is None:
                return "%s wrote no output/failure" % h
        return None

    def kill_data(self):
        step = self.rng.randint(3, 30)
        c = self.cluster("kill")
        victim = next(h for h in c.hosts if c.layout[h] == "data_group")
        print("  kill-data: SIGKILL to %s at step %d of epoch 1 (--seed %d)" % (
            victim, step, self.args.seed), flush=True)
        c.start()
        if not c.wait_for_step(step):
            return "training never reached step %d" % step
        self.engine.run("kill", "--signal", "KILL", c.containers[victim])
        codes = c.wait()
        if codes[victim] != 137:
            return "the killed container exited %s, not 137: the kill did not happen" % (
                codes[victim],)
        others = {h: code for h, code in codes.items() if h != victim}
        if any(others.values()):
            return "the job did not complete: exit statuses %s" % codes
        return exactly_once(c.file(c.head, "output", "data", "report.json"))

    def app_killed(self, c, case, step):
        """Starts `c` and, at `step` of epoch 1, SIGKILLs the app under `train` in a data
        container: (that host, None), or (that host, why the kill did not happen)."""
        victim = next(h for h in c.hosts if c.layout[h] == "data_group")
        print("  %s: SIGKILL to the app under train in %s at step %d of epoch 1 (--seed %d)" % (
            case, victim, step, self.args.seed), flush=True)
        c.start()
        if not c.wait_for_step(step):
            return victim, "training never reached step %d; the head's log ends: %s" % (
                step, c.logs(c.head)[-800:])
        # The app is the one child of PID 1 (train); what it started (a DataLoader's fork server
        # and workers) are its own children.
        p = self.engine.run("exec", c.containers[victim], "sh", "-c",
                            "kill -9 $(cat /proc/1/task/1/children)", check=False)
        if p.returncode != 0:
            return victim, "the kill did not happen in %s: %s" % (victim, p.stderr.strip()[-300:])
        return victim, None

    def kill_app(self):
        # The app's process in a data container dies (kill -9, as the OOM killer does); `train`,
        # PID 1, starts it again and it rejoins: every container exits 0, as SageMaker needs.
        c = self.cluster("killapp")
        victim, why = self.app_killed(c, "kill-app", self.rng.randint(3, 30))
        if why:
            return why
        codes = c.wait()
        log = c.logs(victim)
        if "starting it again (restart 1 of 2)" not in log:
            return "train did not start the app again in %s: %s" % (victim, log[-400:])
        if any(codes.values()):
            return "exit statuses %s, want 0 everywhere (SageMaker: a Failed job)" % codes
        return exactly_once(c.file(c.head, "output", "data", "report.json"))

    def broken_image(self):
        broken = self.args.image.split(":")[0] + "-broken:test"
        with tempfile.TemporaryDirectory() as ctx:
            with open(os.path.join(ctx, "Dockerfile"), "w") as f:
                f.write("FROM %s\nRUN rm -f /usr/lib/x86_64-linux-gnu/libcapnp-rpc-*.so\n" %
                        self.args.image)
            self.engine.run("build", "-q", "-t", broken, ctx)
        try:
            why = self.job(image=broken)
        finally:
            self.engine.run("rmi", "-f", broken, check=False)
        if why is None:
            return "the job case passed on an image without libcapnp-rpc: it cannot fail"
        print("  broken-image: the job case fails as it should: %s" % why[:200], flush=True)
        return None


CASES = ["job", "secret", "stop", "early-stop", "kill-data", "kill-app", "broken-image",
         "pytorch-job", "pytorch-stop"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=os.environ.get("IMAGE", "troupe-train:latest"))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--case", action="append", choices=CASES)
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    print("image test: %s, --seed %d" % (args.image, args.seed), flush=True)
    if not os.path.isdir(DATASET):
        return skip("no Fashion-MNIST at %s (apt-get install dataset-fashion-mnist)" % DATASET)
    engine = Engine()
    if engine.run("image", "inspect", args.image, check=False).returncode != 0:
        print("FAIL: no image %s with %s: run `make image IMAGE_CUDA=off` first" % (
            args.image, engine.name))
        return 1
    # A SIGTERM (a CI timeout) still removes the containers and the network: `finally` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("image test: SIGTERM; cleaning up"))
    run = Run(args, engine)
    passed = failed = skipped = 0
    try:
        for case in args.case or CASES:
            t = time.time()
            try:
                why = getattr(run, case.replace("-", "_"))()
            except Skip as e:
                skipped += 1
                print("SKIP %-13s: %s" % (case, e), flush=True)
                continue
            except Exception as e:  # a broken harness is a failed case, never a pass
                why = "%s: %s" % (type(e).__name__, e)
            line = "%-13s %5.1f s" % (case, time.time() - t)
            if why is None:
                passed += 1
                print("PASS " + line, flush=True)
            else:
                failed += 1
                print("FAIL %s: %s" % (line, why), flush=True)
    finally:
        run.close()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
