"""torch as the judge (issue 60): every case of tests/conformance/script.py run with torch's own
DataLoader and with troupe.data.DataLoader, in every shape a user runs troupe in, and what the
script saw compared, case by case. torch's side is the oracle: plain python3 (torchrun for the DDP
cases); troupe's side runs as plain python3 and under `troupe sim` with 1 and 2 data instances, a
data instance killed at a random moment (seeded, printed) inside the first case, a data instance
joining late, and 2 DDP ranks started torchrun's way. Where troupe promises more than torch
(distinct draws for every sample of every epoch on every rank, the same draws in any shape) the
promise is checked as a property of troupe's side. Every process a run starts is reaped, and one
left behind is a divergence.

    run.py --build BUILD [--quick] [--python LABEL=PATH ...] [--only REGEX] [--report DIR]
           [--seed N]

Prints one row per (case, shape, torch): the verdict and, for a divergence, what differed; with
--report, report.md and report.json there. Exits 1 when any row diverges, 77 when nothing could
run (no PyTorch), 0 otherwise.
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from judge import PROPERTIES, RULES, draws, judge_exit, judge_union, tail

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "script.py")

# The cluster shapes troupe's side runs in (torch's side is always plain python3, or torchrun).
DATA, DNN = "ml.c5.xlarge", "ml.p3.2xlarge"
SHAPES = {
    "plain": None,
    "sim1": ["--group", f"data_group=1:{DATA}", "--group", f"dnn_group=1:{DNN}"],
    "sim2": ["--group", f"data_group=2:{DATA}", "--group", f"dnn_group=1:{DNN}"],
    # algo-3 (a data instance, with --seed 5) starts after the first batch and joins.
    "late": ["--seed", "5", "--group", f"data_group=2:{DATA}", "--group", f"dnn_group=1:{DNN}",
             "--start-late", "algo-3=300", "--start-late-after", "conformance: first batch",
             "--env", "dnn_group:TROUPE_START_WITH=data_group=1",
             "--env", "data_group:TROUPE_START_WITH=data_group=1"],
    "kill": ["--group", f"data_group=2:{DATA}", "--group", f"dnn_group=1:{DNN}"],
    "ddp2": ["--group", f"data_group=1:{DATA}", "--group", f"dnn_group=2:{DNN}"],
    # Where features meet: 2 DDP ranks, 2 data instances, one killed inside the run.
    "ddp_kill": ["--group", f"data_group=2:{DATA}", "--group", f"dnn_group=2:{DNN}"],
}


class Case:
    """A case: how to judge it, the shapes it runs in, whether `make test` runs it."""

    def __init__(self, rule, shapes=("plain", "sim1", "sim2", "kill", "late"), quick=(),
                 props=(), alone=False, delay_ms=0, needs=()):
        self.rule = rule          # the comparison with torch's side (RULES)
        self.shapes = shapes      # troupe's side's shapes in the whole matrix
        self.quick = quick        # the shapes make test runs
        self.props = props        # troupe's promises beyond torch (PROPERTIES)
        self.alone = alone        # ends the script: a run of its own
        self.delay_ms = delay_ms  # per item, so that a kill lands inside it
        self.needs = needs        # modules the case imports beyond torch (a skip without them)


DDP_ONLY = ("ddp2",)
DDP_SHAPES = ("ddp2", "ddp_kill")
EXITS = ("plain", "sim2", "ddp2")
CASES = {
    "order": Case("exact", quick=("plain", "sim2")),
    "shuffle": Case("exact", quick=("sim2",)),
    "generator": Case("exact", quick=("sim2",)),
    "drop_last": Case("exact"),
    "subset_sampler": Case("exact"),
    "weighted_sampler": Case("exact", quick=("sim2",)),
    "batch_sampler": Case("exact"),
    "batch_none": Case("exact", quick=("sim2",)),
    "types": Case("exact", quick=("plain", "sim2")),
    "collate_fn": Case("exact", quick=("sim2",)),
    "worker_init_fn": Case("exact"),
    "pinning": Case("exact", shapes=("plain", "sim2")),
    "draws": Case("order", props=("distinct", "same_in_every_shape"), quick=("plain", "sim2")),
    "persistent": Case("order", props=("distinct", "fresh_epochs"), quick=("plain", "sim2")),
    "prefetch_persistent": Case("order", props=("distinct", "fresh_epochs"), quick=("sim2",),
                                delay_ms=20),
    "draws0": Case("first_epoch", props=("distinct", "same_in_every_shape")),
    "workers0": Case("exact", quick=("plain",)),
    "local": Case("exact", shapes=("plain", "sim2", "ddp2"), quick=("sim2",)),
    "peek": Case("exact", quick=("sim2",)),
    "break": Case("exact"),
    "dataset_change": Case("exact", quick=("sim2",)),
    "many_workers": Case("exact", shapes=("plain", "sim2"), quick=("sim2",)),
    "skip_errors": Case("exact", shapes=("plain", "sim2"), quick=("sim2",)),
    "translated_skip": Case("shapes", shapes=("plain", "sim2"), quick=("sim2",),
                            needs=("torchvision",)),
    "exception_type": Case("caught", shapes=("plain", "sim2"), quick=("sim2",), alone=True),
    "timeout": Case("caught", shapes=("plain", "sim2"), alone=True),
    "ddp_sampler": Case("order", shapes=DDP_SHAPES, quick=DDP_ONLY, props=("distinct",)),
    "ddp_shared": Case("union", shapes=DDP_SHAPES, quick=DDP_ONLY, props=("distinct",)),
    "ddp_persistent": Case("order", shapes=DDP_SHAPES, props=("distinct", "fresh_epochs")),
    "ddp_rank0_peek": Case("steps", shapes=DDP_ONLY, alone=True),
    "ddp_timeout": Case("caught", shapes=DDP_ONLY, alone=True),
    "exit_ok": Case("exit", shapes=EXITS, alone=True),
    "exit_code": Case("exit", shapes=EXITS, quick=("sim2",), alone=True),
    "exit_exception": Case("exit", shapes=("plain", "sim2"), alone=True),
    "exit_signal": Case("exit", shapes=("plain", "sim2"), alone=True),
}


# -- running the scripts --
class Outcome:
    """One run: its exit status, its output, each instance's final code and the head's failure
    file (troupe sim), the records each rank wrote, the processes left behind."""

    def __init__(self):
        self.code = None
        self.output = ""
        self.finals = {}
        self.failure = ""
        self.records = {}  # (case, rank) -> record
        self.leftovers = []
        self.note = ""


def session_members(sid):
    """The pids of the processes in session `sid` (a run's, started with setsid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def launch(commands, timeout, on_line=None):
    """Runs each (argv, env) of `commands` at once, each in a session of its own (torch's DDP
    ranks are two, as torchrun starts them); returns (status, output, leftovers): the first
    non-zero status, the outputs one after the other, and the processes left in the sessions
    (killed, and named)."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True, text=True, errors="replace")
             for argv, env in commands]
    outputs = [[] for _ in procs]

    def read(proc, lines):
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
    readers = [threading.Thread(target=read, args=(p, o), daemon=True)
               for p, o in zip(procs, outputs)]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout
    codes = []
    for proc, lines in zip(procs, outputs):
        try:
            codes.append(proc.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            codes.append(proc.wait())
            lines.append(f"run.py: killed after {timeout} s\n")
    for r in readers:
        r.join(10)
    left = []
    settle = time.monotonic() + 5
    while time.monotonic() < settle:
        left = [pid for p in procs for pid in session_members(p.pid)]
        if not left:
            break
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    code = next((c for c in codes if c != 0), 0)
    return code, "".join("".join(o) for o in outputs), left


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, build, python, label, seed, log, logs=None):
        self.build = os.path.abspath(build)
        self.python = python
        self.label = label
        self.rng = random.Random(seed)
        self.log = log
        self.logs = logs  # a folder for each run's output, or None
        self.env = dict(os.environ, PYTHONPATH=os.path.join(self.build, "python"),
                        PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            self.env.pop(name, None)

    def run(self, side, shape, cases, delay_ms=0):
        """Runs `cases` (one script run) on `side` in `shape`; an Outcome."""
        out = tempfile.mkdtemp(prefix=f"conformance-{side}-{shape}-")
        env = dict(self.env, CONFORMANCE_DELAY_MS=str(delay_ms))
        if shape in DDP_SHAPES:
            env["CONFORMANCE_DDP"] = "1"  # the script calls init_process_group() first
        script = [self.python, SCRIPT, side, out, ",".join(cases)]
        outcome = Outcome()
        on_line = None
        if side == "torch" and shape in DDP_SHAPES:
            # Two processes with the environment torchrun gives them (Debian's torchrun 1.13
            # does not start under Python 3.11).
            port = str(free_port())
            commands = [(script, dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=port)) for r in range(2)]
        elif shape == "plain":
            commands = [(script, env)]
        else:
            commands = [([os.path.join(self.build, "troupe"), "sim", "--keep"] +
                         SHAPES[shape] + ["--"] + script, env)]
            if shape in ("kill", "ddp_kill"):
                on_line = self._killer(outcome)
        started = time.monotonic()
        outcome.code, outcome.output, outcome.leftovers = launch(commands, 600, on_line)
        self.log(f"  {side} {shape} {','.join(cases)}: exit {outcome.code} in "
                 f"{time.monotonic() - started:.1f} s")
        if self.logs:
            name = f"{self.label}-{side}-{shape}-{'-'.join(cases)}"[:150] + ".log"
            with open(os.path.join(self.logs, name), "w") as f:
                f.write(outcome.output)
        if side == "troupe" and shape != "plain":
            self._instances(outcome)
        for name in os.listdir(out):
            m = re.fullmatch(r"\w+\.rank(\d+)\.(\w+)\.json", name)
            if m:
                with open(os.path.join(out, name)) as f:
                    outcome.records[(m[2], int(m[1]))] = json.load(f)
        shutil.rmtree(out, ignore_errors=True)
        return outcome

    def _killer(self, outcome):
        """SIGKILL to a data instance at a random moment (seeded) after the script's first
        batch; `outcome.note` says which and when, or why not."""
        seen, state = [], {"done": False}
        delay = self.rng.uniform(0.0, 1.5)

        def on_line(line, proc):
            seen.append(line)
            if state["done"] or "conformance: first batch" not in line:
                return
            state["done"] = True
            pids = sorted((m[1], int(m[2])) for m in re.finditer(
                r"troupe sim: (\S+)\s+data_group\s+\S+\s+\S+\s+pid=(\d+)", "".join(seen)))

            def kill():
                time.sleep(delay)
                if not pids:
                    outcome.note = "no data instance's pid in troupe sim's output"
                    return
                host, pid = pids[0]
                try:
                    os.kill(pid, signal.SIGKILL)
                    outcome.note = f"SIGKILL to {host} (pid {pid}) {delay:.2f} s after the " \
                                   "first batch"
                except OSError as e:
                    outcome.note = f"the kill of {host} (pid {pid}) failed: {e}"
            threading.Thread(target=kill, daemon=True).start()
        return on_line

    def _instances(self, outcome):
        """Each instance's final exit code and the head's failure file (troupe sim --keep)."""
        m = re.search(r"roots in (\S+)", outcome.output)
        if not m:
            return
        roots = m[1]
        try:
            for host in os.listdir(roots):
                status = os.path.join(roots, "exit-status", host)
                role = os.path.join(roots, host, "role")
                if os.path.isfile(role):
                    with open(role) as f:
                        if f.read().startswith("head"):
                            path = os.path.join(roots, host, "output", "failure")
                            if os.path.exists(path):
                                with open(path) as f:
                                    outcome.failure = f.read()
            folder = os.path.join(roots, "exit-status")
            for host in os.listdir(folder) if os.path.isdir(folder) else []:
                with open(os.path.join(folder, host)) as f:
                    status = json.load(f)
                # As the cloud judges it: the last process's code, 128 + a killing signal.
                outcome.finals[host] = (128 + status["term_signal"] if status["term_signal"]
                                        else status["exit_status"])
        finally:
            shutil.rmtree(roots, ignore_errors=True)


class Matrix:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.started = time.monotonic()

    def log(self, text):
        print(text, flush=True)

    def verdict(self, case, shape, torch_label, torch_version, ok, why, seconds=0.0):
        row = {"case": case, "shape": shape, "torch": f"{torch_label} {torch_version}",
               "verdict": "as torch" if ok else "DIVERGES", "why": "; ".join(why)}
        self.rows.append(row)
        self.log(f"{'ok  ' if ok else 'FAIL'} {case:18} {shape:6} {row['torch']:22} "
                 f"{row['why']}")

    def run(self, label, python):
        logs = None
        if self.args.report:
            logs = os.path.join(self.args.report, "logs")
            os.makedirs(logs, exist_ok=True)
        runner = Runner(self.args.build, python, label, self.args.seed, self.log, logs)
        version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                                 capture_output=True, text=True).stdout.strip()
        if not version:
            self.log(f"SKIP {label}: PyTorch cannot be imported by {python}")
            return False
        self.log(f"torch {version} ({label}: {python})")
        selected = {}
        for name, c in CASES.items():
            if not re.search(self.args.only, name):
                continue
            missing = [m for m in c.needs if subprocess.run(
                [python, "-c", f"import {m}"], capture_output=True).returncode != 0]
            if missing:
                self.log(f"SKIP {name}: {', '.join(missing)} cannot be imported by {python}")
                continue
            selected[name] = c
        plan = collections.defaultdict(list)  # (shape, delay) -> cases run together
        for name, c in selected.items():
            shapes = c.quick if self.args.quick else c.shapes
            for shape in shapes:
                if c.alone:
                    plan[(shape, name)].append(name)
                else:
                    plan[(shape, "")].append(name)
        torch_side = {}  # (a run's key) -> torch's Outcome

        def oracle(name, ddp):
            """torch's side of case `name`: plain python3, or torchrun for the DDP shape; the
            cases that do not end the script share one run."""
            shape = "ddp2" if ddp else "plain"
            key = (name if CASES[name].alone else "", shape)
            if key not in torch_side:
                names = [name] if CASES[name].alone else [
                    n for n, c in selected.items() if not c.alone and
                    any(s in (c.quick if self.args.quick else c.shapes) for s in (
                        DDP_SHAPES if ddp else ("plain", "sim1", "sim2", "kill", "late")))]
                torch_side[key] = runner.run("torch", shape, names)
            return torch_side[key]

        same_everywhere = collections.defaultdict(dict)
        runs = []
        for (shape, _), names in sorted(plan.items()):
            # Slower items where a fault or a join must land inside the run.
            delay = {"kill": 30, "ddp_kill": 30, "late": 50}.get(shape, 0)
            outcome = runner.run("troupe", shape, names, delay)
            missing = [n for n in names if not any(k[0] == n for k in outcome.records)]
            if missing and len(names) > 1:
                # A case that fails the job fails the run it shares: each is judged alone.
                self.log(f"  (the run failed: each of its {len(names)} cases again alone)")
                runs += [(shape, [n], runner.run("troupe", shape, [n], delay)) for n in names]
            else:
                runs.append((shape, names, outcome))
        for shape, names, outcome in runs:
            ddp = shape in DDP_SHAPES
            for name in names:
                case = CASES[name]
                why = []
                if outcome.leftovers:
                    why.append(f"processes left behind: {outcome.leftovers}")
                if shape in ("kill", "ddp_kill") and "SIGKILL to" not in outcome.note:
                    why.append(f"the fault was not injected ({outcome.note or 'no first batch'})")
                if shape == "late" and "joined the running job" not in outcome.output:
                    why.append("the late data instance did not join the running job")
                reference = oracle(name, ddp)
                if case.rule == "exit":
                    why += judge_exit(name, reference, outcome, shape)
                else:
                    ranks = sorted(r for (n, r) in reference.records if n == name)
                    mine = sorted(r for (n, r) in outcome.records if n == name)
                    if not ranks:
                        why.append(f"torch's side wrote no record (exit {reference.code}): "
                                   f"{tail(reference.output)}")
                    elif ranks != mine:
                        why.append(f"records of ranks {mine}, torch's {ranks} (exit "
                                   f"{outcome.code}): {tail(outcome.output)}")
                    elif case.rule == "union":
                        why += judge_union([reference.records[(name, r)] for r in ranks],
                                           [outcome.records[(name, r)] for r in ranks])
                    else:
                        for r in ranks:
                            for d in RULES[case.rule](reference.records[(name, r)],
                                                      outcome.records[(name, r)]):
                                why.append((f"rank {r}: " if ddp else "") + d)
                        records = [outcome.records[(name, r)] for r in ranks]
                        for p in case.props:
                            if p in PROPERTIES:
                                why += PROPERTIES[p](records)
                        if "same_in_every_shape" in case.props:
                            same_everywhere[name][shape] = draws(records[0])
                    head = outcome.finals.get(head_of(outcome.output), outcome.code)
                    if head not in (0, None) and case.rule != "caught":
                        why.append(f"troupe's head exited {head}: {tail(outcome.output)}")
                    if shape not in ("kill", "ddp_kill", "late") and \
                            outcome.code not in (0, None) and \
                            case.rule != "caught":
                        why.append(f"troupe's run exited {outcome.code}: {tail(outcome.output)}")
                self.verdict(name, shape, label, version, not why,
                             why or ([outcome.note] if outcome.note else []))
        for name, by_shape in same_everywhere.items():
            shapes = sorted(by_shape)
            first = by_shape[shapes[0]]
            differ = [s for s in shapes[1:] if by_shape[s] != first]
            self.verdict(name, "/".join(shapes), label, version, not differ,
                         [f"draws in {', '.join(differ)} differ from {shapes[0]}'s"] if differ
                         else [])
        return True


def head_of(output):
    """The head's host, as its log lines name it ("[algo-2 dnn_group head]")."""
    m = re.search(r"\[(\S+) \S+ head\]", output)
    return m[1] if m else ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", required=True)
    p.add_argument("--python", action="append", default=[],
                   help="LABEL=PATH: a Python with PyTorch (default debian=/usr/bin/python3)")
    p.add_argument("--quick", action="store_true", help="the cases and shapes make test runs")
    p.add_argument("--only", default="", help="cases whose name matches this regex")
    p.add_argument("--report", help="a folder for report.md and report.json")
    p.add_argument("--seed", type=int, default=None, help="the fault injections' seed")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    print(f"conformance: seed {args.seed} (--seed {args.seed} injects the same faults)",
          flush=True)
    pythons = [item.split("=", 1) for item in args.python] or [["debian", "/usr/bin/python3"]]
    matrix = Matrix(args)
    ran = [matrix.run(label, path) for label, path in pythons]
    seconds = time.monotonic() - matrix.started
    divergences = [r for r in matrix.rows if r["verdict"] != "as torch"]
    print(f"conformance: {len(matrix.rows)} rows, {len(divergences)} divergences, "
          f"{seconds:.0f} s", flush=True)
    if args.report:
        write_report(args.report, matrix.rows, seconds, args.seed)
    if not any(ran):
        return 77
    return 1 if divergences else 0


def write_report(folder, rows, seconds, seed):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump({"rows": rows, "seconds": seconds, "seed": seed}, f, indent=1)
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write(f"# troupe.data against torch's DataLoader\n\n{len(rows)} rows, "
                f"{sum(r['verdict'] != 'as torch' for r in rows)} divergences, {seconds:.0f} s, "
                f"seed {seed}\n\n| case | shape | torch | troupe | verdict |\n| --- | --- | --- | "
                "--- | --- |\n")
        for r in rows:
            f.write(f"| {r['case']} | {r['shape']} | {r['torch']} | {r['why'] or '-'} | "
                    f"{r['verdict']} |\n")


if __name__ == "__main__":
    sys.exit(main())
