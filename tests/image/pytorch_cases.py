"""The pytorch-* cases of tests/image/image_test.py (its docstring says what each checks): a
PyTorch script in script mode, run by the image's `train` as SageMaker starts it."""

import json
import os
import shutil
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES, EPOCHS, BATCH = 3000, 2, 50
STEPS = SAMPLES // BATCH
INTERRUPTED = 6  # troupe/exit_codes.h


class Skip(Exception):
    """A case that cannot run on this image: reported as a skip with its reason, never a pass."""


def hyperparameters():
    """What the SageMaker Python SDK's PyTorch estimator writes for entry_point='train.py',
    source_dir=... (every value a string, its own JSON-encoded), plus the script's own."""
    return {
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps("file:///opt/ml/source/sourcedir.tar.gz"),
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": json.dumps("troupe-image-test"),
        "sagemaker_region": json.dumps("us-east-1"),
        "epochs": str(EPOCHS),
        "batch-size": str(BATCH),
        "samples": str(SAMPLES),
        "sleep-ms": "10",
    }


def exactly_once(ids_json):
    """Why ids.json (the script's record of every id it trained on) is not every sample of every
    epoch once, or None. The count is this test's, from the ids themselves."""
    if ids_json is None:
        return "the head wrote no output/data/ids.json"
    ids = json.loads(ids_json)
    if sorted(ids) != [str(e) for e in range(EPOCHS)]:
        return "ids.json has epochs %s, not 0..%d" % (sorted(ids), EPOCHS - 1)
    for epoch, got in sorted(ids.items()):
        if sorted(got) != list(range(SAMPLES)):
            dup = len(got) - len(set(got))
            missing = SAMPLES - len(set(got) & set(range(SAMPLES)))
            return "epoch %s: %d ids, %d duplicates, %d missing (want %d, 0, 0)" % (
                epoch, len(got), dup, missing, SAMPLES)
    return None


class PytorchCases:
    """Mixed into image_test.Run: self.cluster(), self.app_killed(), self.engine, self.rng,
    self.args, self.work."""

    def _source(self):
        """sourcedir.tar.gz as the SDK makes it from source_dir: the script and a
        requirements.txt (numpy: Debian's, through the venv's system site packages, so pip has
        nothing to fetch on the containers' network, which has no route out)."""
        path = os.path.join(self.work, "sourcedir.tar.gz")
        if not os.path.exists(path):
            src = os.path.join(self.work, "source")
            os.makedirs(src)
            shutil.copy2(os.path.join(HERE, "pytorch", "train.py"), src)
            with open(os.path.join(src, "requirements.txt"), "w") as f:
                f.write("numpy\n")
            with tarfile.open(path, "w:gz") as tar:
                for name in sorted(os.listdir(src)):
                    tar.add(os.path.join(src, name), arcname=name)
        return path

    def _need_torch(self):
        env = self.engine.run("image", "inspect", "--format", "{{json .Config.Env}}",
                              self.args.image).stdout
        if "/opt/troupe/venv/bin" not in env:
            raise Skip("%s has no PyTorch: it was built with IMAGE_TORCH=off (`make image` "
                       "builds the PyTorch image)" % self.args.image)

    def _script_cluster(self, name, **kw):
        self._need_torch()
        return self.cluster(name, hps=hyperparameters(), source=self._source(), **kw)

    def pytorch_job(self):
        c = self._script_cluster("torchjob")
        victim, why = self.app_killed(c, "pytorch-job", self.rng.randint(3, STEPS - 20))
        if why:
            return why
        codes = c.wait()
        log = c.logs(victim)
        if "starting it again (restart 1 of 2)" not in log:
            return "train did not start the app again in %s: %s" % (victim, log[-600:])
        if any(codes.values()):
            return "exit statuses %s, want 0 everywhere; the head's log ends: %s" % (
                codes, c.logs(c.head)[-800:])
        head_log = c.logs(c.head)
        if "train: script mode: train.py" not in head_log:
            return "the head's log never says it ran train.py in script mode: %s" % head_log[-600:]
        env = next((json.loads(line.split("script: env ", 1)[1]) for line in head_log.splitlines()
                    if "script: env " in line), None)
        if env is None:
            return "the script printed no environment line"
        saw = (env.get("SM_CURRENT_HOST"), env.get("SM_CURRENT_INSTANCE_GROUP"),
               json.loads(env.get("SM_HOSTS") or "null"),
               "train" in json.loads(env.get("SM_CHANNELS") or "[]"),
               json.loads(env.get("SM_USER_ARGS") or "null"))
        want = (c.head, "dnn_group", c.hosts, True,
                ["--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--samples", str(SAMPLES),
                 "--sleep-ms", "10"])
        if saw != want:
            return "the script saw %s, want %s" % (saw, want)
        for h in c.hosts:
            if c.file(h, "output", "success") is None:
                return "%s wrote no output/success" % h
        if not os.path.exists(os.path.join(c.root(c.head), "model", "model.pt")):
            return "no model.pt in the head's /opt/ml/model"
        return exactly_once(c.file(c.head, "output", "data", "ids.json"))

    def pytorch_stop(self):
        step = self.rng.randint(3, STEPS - 20)
        print("  pytorch-stop: every container stopped at step %d of epoch 1 (--seed %d)" % (
            step, self.args.seed), flush=True)
        c = self._script_cluster("torchstop")
        c.start()
        if not c.wait_for_step(step):
            return "training never reached step %d; the head's log ends: %s" % (
                step, c.logs(c.head)[-800:])
        c.stop(c.hosts)
        codes = c.wait()
        if any(code != INTERRUPTED for code in codes.values()):
            return "exit statuses %s after the stop, want %d everywhere; the head's log ends: %s" % (
                codes, INTERRUPTED, c.logs(c.head)[-800:])
        for h in c.hosts:
            failure = c.file(h, "output", "failure")
            if failure is None or "SIGTERM" not in failure:
                return "%s: output/failure is %r; it should name the stop (SIGTERM)" % (h, failure)
        state = os.path.join(c.root(c.head), "checkpoints", "state.pt")
        if not os.path.exists(state):
            return "the script saved no state.pt in the head's /opt/ml/checkpoints"
        saved = os.path.join(self.work, "torch-checkpoint-s3")  # what SageMaker uploads
        os.makedirs(saved)
        shutil.copy2(state, saved)
        r = self._script_cluster("torchresume", checkpoints=saved,
                                 layout={"algo-1": "dnn_group", "algo-2": "data_group",
                                         "algo-3": "data_group"})
        r.start()
        codes = r.wait()
        if any(codes.values()):
            return "the resumed job exited %s, want 0 everywhere; its head's log ends: %s" % (
                codes, r.logs(r.head)[-800:])
        if "script: resumed from" not in r.logs(r.head):
            return "the resumed job's script never said it resumed from the saved state"
        why = exactly_once(r.file(r.head, "output", "data", "ids.json"))
        return "across the stop and the resumed job: " + why if why else None

