"""How tests/conformance/run.py judges a case (tests/conformance/script.py's records): each
rule compares what the script saw under torch's DataLoader with what it saw under troupe.data's;
each property checks one of troupe's promises past torch on troupe's side alone; judge_exit reads
the job's outcome on every instance as the cloud does. Each returns the differences, in words (an
empty list: as torch)."""
import json


def ids(record):
    return [[row[0] for row in e["samples"]] for e in record["epochs"]]


def first_difference(a, b, path="batch"):
    """Where two JSON values first differ, in words."""
    if type(a) != type(b):
        return f"{path}: {short(a)} vs {short(b)}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}: key {k!r} only on {'torch' if k in a else 'troupe'}'s side"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return ""
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{k}]")
            if d:
                return d
        return ""
    return "" if a == b else f"{path}: {short(a)} vs {short(b)}"


def short(v):
    text = json.dumps(v)
    return text if len(text) < 120 else text[:117] + "..."


def judge_exact(torch_rec, troupe_rec):
    out = []
    if torch_rec.get("len") != troupe_rec.get("len"):
        out.append(f"len(loader) {torch_rec.get('len')} vs {troupe_rec.get('len')}")
    for key in ("peeked", "after", "pinned"):
        if key in torch_rec:
            d = first_difference(torch_rec[key], troupe_rec.get(key), key)
            if d:
                out.append(d)
    for e, (a, b) in enumerate(zip(torch_rec["epochs"], troupe_rec["epochs"])):
        d = first_difference(a["batches"], b["batches"], f"epoch {e} batch")
        if d:
            out.append(d)
        if a["rng"] != b["rng"]:
            out.append(f"epoch {e}: the script's generators after the pass differ")
    if len(torch_rec["epochs"]) != len(troupe_rec["epochs"]):
        out.append(f"{len(torch_rec['epochs'])} epochs vs {len(troupe_rec['epochs'])}")
    return out


def judge_order(torch_rec, troupe_rec):
    """The samples in torch's order, batch by batch, and the generators after; the draws are
    troupe's own (judged as properties)."""
    out = []
    if torch_rec.get("len") != troupe_rec.get("len"):
        out.append(f"len(loader) {torch_rec.get('len')} vs {troupe_rec.get('len')}")
    for e, (a, b) in enumerate(zip(ids(torch_rec), ids(troupe_rec))):
        if a != b:
            out.append(f"epoch {e}: sample order differs ({len(a)} vs {len(b)} samples; first "
                       f"at {next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))})")
    for e, (a, b) in enumerate(zip(torch_rec["epochs"], troupe_rec["epochs"])):
        if [len(x.get("list", [{}])[0].get("values", [])) for x in a["batches"]] != \
                [len(x.get("list", [{}])[0].get("values", [])) for x in b["batches"]]:
            out.append(f"epoch {e}: batch sizes differ")
        if a["rng"] != b["rng"]:
            out.append(f"epoch {e}: the script's generators after the pass differ")
    return out


def without_pixels(value):
    """A batch's description without its float tensors' values (random crops are each side's
    own draws): structure, dtypes, shapes and every other value stay."""
    if isinstance(value, dict):
        if "tensor" in value and "float" in value["tensor"]:
            return {k: v for k, v in value.items() if k != "values"}
        return {k: without_pixels(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_pixels(v) for v in value]
    return value


def judge_shapes(torch_rec, troupe_rec):
    """As judge_exact, but images' pixels (each side draws its own crops)."""
    strip = {"epochs": [{"batches": without_pixels(e["batches"]), "rng": e["rng"]}
                        for e in torch_rec["epochs"]], "len": torch_rec["len"]}
    mine = {"epochs": [{"batches": without_pixels(e["batches"]), "rng": e["rng"]}
                       for e in troupe_rec["epochs"]], "len": troupe_rec["len"]}
    return judge_exact(strip, mine)


def judge_caught(torch_rec, troupe_rec):
    if torch_rec["caught"] != troupe_rec["caught"]:
        return [f"the loop's exception: torch {torch_rec['caught']} ({torch_rec.get('first_line')})"
                f" vs troupe {troupe_rec['caught']} ({troupe_rec.get('first_line')})"]
    return []


def judge_steps(torch_rec, troupe_rec):
    a, b = torch_rec["epochs"], troupe_rec["epochs"]
    return [] if a == b else [f"steps {short(a)} vs {short(b)}"]


def judge_union(torch_ranks, troupe_ranks):
    """DDP ranks sharing each pass: every sample of torch's epoch once across the ranks, and as
    many batches on every rank (torch's DistributedSampler splits otherwise: the order is not
    compared)."""
    out = []
    lens = {r["len"] for r in troupe_ranks}
    if len(lens) != 1:
        out.append(f"the ranks' len(loader) differ: {sorted(lens)}")
    for e in range(len(torch_ranks[0]["epochs"])):
        want = sorted(i for r in torch_ranks for i in ids(r)[e])
        got = sorted(i for r in troupe_ranks for i in ids(r)[e])
        if want != got:
            out.append(f"epoch {e}: the ranks' samples together differ from torch's "
                       f"({len(got)} vs {len(want)}, {len(set(got))} distinct)")
        steps = {len(r["epochs"][e]["batches"]) for r in troupe_ranks}
        if len(steps) != 1:
            out.append(f"epoch {e}: the ranks took {sorted(steps)} batches")
    return out


def judge_ids(torch_rec, troupe_rec):
    """The samples in torch's order, batch by batch, nothing else."""
    out = []
    if torch_rec.get("len") != troupe_rec.get("len"):
        out.append(f"len(loader) {torch_rec.get('len')} vs {troupe_rec.get('len')}")
    for e, (a, b) in enumerate(zip(ids(torch_rec), ids(troupe_rec))):
        if a != b:
            out.append(f"epoch {e}: sample order differs")
    return out


def judge_first_epoch(torch_rec, troupe_rec):
    """The first epoch's samples in torch's order. (With num_workers=0 torch's items draw from the
    script's generator, so its next epochs' shuffles follow what they drew; troupe's items never
    touch the script's generators - docs/pytorch.md, "Outside a cluster" - and its later epochs
    are judged the same in every shape instead.)"""
    first = dict(torch_rec, epochs=torch_rec["epochs"][:1])
    return judge_ids(first, dict(troupe_rec, epochs=troupe_rec["epochs"][:1]))


RULES = {"exact": judge_exact, "shapes": judge_shapes, "ids": judge_ids,
         "first_epoch": judge_first_epoch, "order": judge_order, "caught": judge_caught,
         "steps": judge_steps}


def draws(record):
    """(epoch, id) -> the sample's draws (every value after its id)."""
    return {(e, row[0]): json.dumps(row[1:]) for e, ep in enumerate(record["epochs"])
            for row in ep["samples"]}


def prop_distinct(records):
    every = [v for r in records for v in draws(r).values()]
    if len(set(every)) != len(every):
        return [f"only {len(set(every))} of {len(every)} (epoch, sample) draws distinct"]
    return []


def prop_fresh_epochs(records):
    out = []
    for r in records:
        d = draws(r)
        same = sum(1 for (e, i), v in d.items() if e > 0 and d.get((0, i)) == v)
        if same:
            out.append(f"{same} samples drew in a later epoch what they drew in epoch 0")
    return out


PROPERTIES = {"distinct": prop_distinct, "fresh_epochs": prop_fresh_epochs}


def judge_exit(name, reference, outcome, shape):
    """The script's exit status under torch against the job's outcome on every instance."""
    why = []
    want = reference.code
    if shape == "plain":
        if outcome.code != want:
            why.append(f"python3 exited {outcome.code}, under torch {want}")
        return why
    finals = outcome.finals
    if not finals:
        return [f"no instance's exit status (troupe sim exited {outcome.code}): "
                f"{tail(outcome.output)}"]
    if want == 0:
        bad = {h: c for h, c in finals.items() if c != 0}
        if bad or outcome.code != 0:
            why.append(f"torch's script exited 0; instances {bad}, troupe sim {outcome.code}")
    else:
        zero = [h for h, c in finals.items() if c == 0]
        if zero or outcome.code == 0:
            why.append(f"torch's script exited {want}; {', '.join(zero) or 'troupe sim'} exited 0"
                       f" ({finals})")
        if name == "exit_code" and "4" not in outcome.failure:
            why.append(f"the failure file does not name the status 4: {outcome.failure!r}")
    return why


def tail(text, lines=6):
    """A run's last lines, on one line, for a verdict."""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
