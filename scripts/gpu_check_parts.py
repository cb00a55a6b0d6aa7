"""The parts of scripts/gpu_check.py that judge rather than run: a check's record, a `troupe sim`
run watched from outside, the digest of "every sample once", the sweep's scores and the table."""
import json
import os
import re
import signal
import subprocess
import time

MASK = (1 << 64) - 1


def digest(samples):
    # docs/hetero_train.md: the sum mod 2^64 of splitmix64's finaliser of every id, each once.
    total = 0
    for i in range(samples):
        z = (i + 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        total = (total + (z ^ (z >> 31))) & MASK
    return "0x%016x" % total


class Check:
    def __init__(self, name, what):
        self.name, self.what = name, what
        self.status = "passed"
        self.problems = []
        self.figures = {}
        self.seconds = 0.0
        self.note = ""

    def require(self, ok, problem):
        if not ok:
            self.problems.append(problem)
            self.status = "failed"
        return ok

    def skip(self, why):
        self.status = "skipped"
        self.note = why

    def json(self):
        return {"name": self.name, "what": self.what, "status": self.status,
                "seconds": round(self.seconds, 1), "problems": self.problems,
                "figures": self.figures, "note": self.note}


class Sim:
    """One `troupe sim` run: its own session, its output in a log, reaped whatever happens."""

    INSTANCE = re.compile(r"troupe sim: (\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+pid=(\d+)")

    def __init__(self, argv, log, env):
        self.argv, self.log_path = argv, log
        self.log = open(log, "wb")
        self.log.write((" ".join(argv) + "\n").encode())
        self.log.flush()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.code = None

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, pattern, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.text())
            if m or self.proc.poll() is not None:
                return m
            time.sleep(0.05)
        return None

    def instances(self):
        return [{"host": m[0], "group": m[1], "type": m[2], "pid": int(m[4])}
                for m in self.INSTANCE.findall(self.text())]

    def wait(self, timeout):
        try:
            self.code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            self.code = None
        finally:
            self.log.close()
        return self.code

    def stop(self):
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                pass

    def leftovers(self):
        # Every process the run started must be gone once troupe sim has exited.
        left = []
        for i in self.instances():
            try:
                with open("/proc/%d/stat" % i["pid"]) as f:
                    if f.read().split(") ")[-1].split()[0] != "Z":
                        left.append(i["pid"])
            except OSError:
                pass
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return left


def environ_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return dict(e.split("=", 1) for e in f.read().decode(errors="replace").split("\0")
                        if "=" in e)
    except OSError:
        return None


def gpu_processes():
    # The processes using the GPU, as its driver sees them: the oracle for "only the trainer".
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    pids = []
    for line in out.splitlines():
        part = line.split(",")[0].strip()
        if part.isdigit():
            pids.append(int(part))
    return pids



def score_sweep(sweep, sweep_dir):
    """bench_pipeline's sweep, scored: its own figures per data-group size, and the steady rate.

    The steady rate is a run's samples over the seconds of its epochs after the first. The first
    epoch pays the start-up (every augmenter loading the dataset, 0.4-0.5 s, and the stream
    filling), which on a fast trainer is most of a short epoch: with a GPU an epoch of 60,000
    samples takes 0.4 s at 12 data instances, the first 0.8 s. One epoch only: the bench's rate.
    Against linear: n times the one-instance run's rate; added: what each instance since the row
    before added, as a share of one instance's; saturation: the row before the first whose added
    share falls under 0.5.
    """
    rows = [{"data_instances": s["data_instances"], "samples_per_s": round(s["samples_per_s"]),
             "steps_per_s": round(s["samples_per_s"] / sweep["settings"]["batch_size"], 1),
             "of_linear": s["of_linear"], "added": s["added_instance_efficiency"],
             "data_wait": s["measured_data_wait_fraction"]} for s in sweep["setups"]]
    for r in rows:
        path = os.path.join(sweep_dir, "blur%d-data%d-0-0.json" % (sweep["setups"][0]["blur"],
                                                                    r["data_instances"]))
        try:
            with open(path) as f:
                rep = json.load(f)
            epochs = rep["epochs"][1:] or rep["epochs"]
            r["steady_samples_per_s"] = round(sum(e["samples"] for e in epochs) /
                                              sum(e["seconds"] for e in epochs))
            r["trainer_process_ms_per_batch"] = rep["trainer_cpu"]["process_ms_per_batch"]
            r["compute_step_ms"] = rep["rates"]["compute_step_ms"]
            r["augment_images_per_vcpu_second"] = rep["rates"]["augment_images_per_vcpu_second"]
        except (OSError, ValueError, KeyError, ZeroDivisionError):
            r["steady_samples_per_s"] = None
    one = next((r["steady_samples_per_s"] for r in rows if r["data_instances"] == 1), None)
    previous, saturated = None, None
    for r in rows:
        n, rate = r["data_instances"], r["steady_samples_per_s"]
        r["steady_of_linear"] = round(rate / (n * one), 3) if n and one and rate else None
        r["steady_added"] = None
        if previous and previous[0] >= 1 and one and rate:
            r["steady_added"] = round((rate - previous[1]) / ((n - previous[0]) * one), 3)
            if saturated is None and r["steady_added"] < 0.5:
                saturated = previous[0]
        previous = (n, rate) if rate else previous
    # The goal (issue 40): at least 90% of linear up to saturation. A figure, not a check.
    upto = [r for r in rows if r["data_instances"] >= 1 and
            (saturated is None or r["data_instances"] <= saturated)]
    return {"rows": rows,
            "saturates_at_data_instances": sweep["per_blur"][0]["saturates_at_data_instances"],
            "steady_saturates_at_data_instances": saturated,
            "goal_90_percent_of_linear_up_to_saturation":
                all((r["steady_of_linear"] or 0) >= 0.9 for r in upto)}


def sweep_table(rows):
    lines = ["%6s %10s %8s %10s %8s %10s %10s %10s %8s %10s" % (
        "data", "samples/s", "steps/s", "of linear", "added", "data wait", "steady/s",
        "of linear", "added", "trainer ms")]
    for r in rows:
        lines.append("%6d %10d %8.1f %10s %8s %9.0f%% %10s %10s %8s %10s" % (
            r["data_instances"], r["samples_per_s"], r["steps_per_s"], pct(r["of_linear"]),
            pct(r["added"]), 100 * r["data_wait"], r.get("steady_samples_per_s") or "-",
            pct(r.get("steady_of_linear")), pct(r.get("steady_added")),
            "%.2f" % r["trainer_process_ms_per_batch"] if r.get("trainer_process_ms_per_batch")
            else "-"))
    lines.append("(the bench's rate counts every epoch; steady: the epochs after the first; "
                 "trainer ms: the trainer's process CPU per batch)")
    return lines


def pct(v):
    return "-" if v is None else "%.0f%%" % (100 * v)


def summary(c):
    f = c.figures
    if c.note and c.status == "skipped":
        return c.note
    if c.name == "gpu":
        return "%s; %s CPUs" % ("; ".join(f.get("gpus") or ["no GPU"]), f.get("cpus"))
    if c.name == "trainer" and "gradients_worst_relative_difference" in f:
        return "%s: loss %s vs %s, gradients %.1e, weights after 20 steps %.1e of the largest" % (
            f["gpu"], f["cpu_loss"], f["gpu_loss"], f["gradients_worst_relative_difference"],
            f.get("weights_worst_relative_difference_after_20_steps", float("nan")))
    if c.name == "pytorch" and "test_accuracy" in f:
        return "torch %s, Python %s: accuracy %s, epochs %s s, data wait %s s" % (
            f["torch"], f["python"], f["test_accuracy"],
            ", ".join("%.1f" % (x or 0) for x in f["epoch_seconds"]),
            ", ".join("%.1f" % (x or 0) for x in f["wait_seconds"]))
    if c.name.startswith("train") and "test_accuracy" in f:
        text = "accuracy %.4f, %.2f ms/step, %.0f samples/s, data wait %.0f%%" % (
            f["test_accuracy"] or 0, f["mean_step_ms"] or 0, f["samples_per_s"] or 0,
            100 * (f["data_wait_fraction"] or 0))
        if "killed" in f:
            text += "; killed %s after step %s (seed %s)" % (f["killed"]["host"],
                                                              f["kill_after_step"], f["seed"])
        return text
    if c.name == "compare" and "compare" in f:
        r = (f["compare"].get("rounds") or [{}])[0]
        h, e = r.get("homogeneous", {}), r.get("heterogeneous", {})
        if "step_ms" in h and "step_ms" in e:
            return "alone %.2f ms/step, + 2 x c5.xlarge %.2f ms/step: %.2fx, saving %.0f%%" % (
                h["step_ms"], e["step_ms"], r.get("speedup", 0), 100 * r.get("saving", 0))
    if c.name == "scaling" and "rows" in f:
        return "steady rate saturates at %s data instances; 90%% of linear up to it: %s" % (
            f["steady_saturates_at_data_instances"],
            f["goal_90_percent_of_linear_up_to_saturation"])
    return ""
