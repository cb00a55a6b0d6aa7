"""troupe.data.DataLoader's worker processes: what they run (``_worker_main``: ``dataset[i]`` and
the collate function for each batch the node asks for, the tensors into shared memory;
python/src/workers.h has the protocol), and the batch structure they hand over."""

import os
import sys
import traceback

from troupe._common import _torch, numpy

def _in_cluster():
    """Whether this process runs as an instance of a troupe job (troupe sim, SageMaker, Slurm,
    Kubernetes, or a cluster file given): else a plain ``python3 train.py``."""
    env = os.environ
    return bool(env.get("TROUPE_SM_ROOT") or env.get("TROUPE_CLUSTER_FILE") or
                env.get("SLURM_JOB_ID") or env.get("KUBERNETES_SERVICE_HOST") or
                os.path.exists("/opt/ml/input/config/resourceconfig.json") or
                any(a == "--cluster" or a.startswith("--cluster=") for a in sys.argv))


def _cpu_list(text):
    """"0-3,6" -> {0, 1, 2, 3, 6} (the kernel's CPU list syntax, as TROUPE_CPUS has it)."""
    cpus = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _flatten(value, tensors):
    """A collated batch as a JSON-able structure over a flat list of arrays."""
    torch = _torch()
    if torch.is_tensor(value):
        tensors.append(value.detach().cpu().contiguous().numpy())
        return {"t": len(tensors) - 1}
    if isinstance(value, numpy.ndarray):
        tensors.append(numpy.ascontiguousarray(value))
        return {"t": len(tensors) - 1}
    if isinstance(value, tuple):
        return {"tuple": [_flatten(v, tensors) for v in value]}
    if isinstance(value, list):
        return {"list": [_flatten(v, tensors) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[k, _flatten(v, tensors)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"DataLoader: a collated batch holds a {type(value).__name__}; batches carry "
                    "tensors, numpy arrays, numbers and strings in tuples, lists and dicts")


def _unflatten(structure, tensors):
    if "t" in structure:
        return tensors[structure["t"]]
    if "tuple" in structure:
        return tuple(_unflatten(v, tensors) for v in structure["tuple"])
    if "list" in structure:
        return [_unflatten(v, tensors) for v in structure["list"]]
    if "dict" in structure:
        return {k: _unflatten(v, tensors) for k, v in structure["dict"]}
    return structure["v"]


def _read_exact(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _worker_main(dataset, collate, request, reply, memory, size, skip_errors=False):
    """A DataLoader worker process: dataset[i] and collate for each batch the node asks for, the
    tensors into shared memory (python/src/workers.h has the protocol). Ends when the node's
    process does (its pipe closes)."""
    import json
    import mmap
    import struct
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: never outlive the node
    except Exception:
        pass
    shared = mmap.mmap(memory, size)
    view = numpy.frombuffer(shared, dtype=numpy.uint8)
    while True:
        head = _read_exact(request, 8)
        if head is None:
            os._exit(0)
        epoch, n = struct.unpack("<II", head)
        ids = struct.unpack(f"<{n}I", _read_exact(request, 4 * n))
        index = None
        skipped = []
        try:
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
            samples = []
            for index in ids:
                try:
                    samples.append(dataset[index])
                except Exception as e:
                    if not skip_errors:
                        raise
                    skipped.append([index, f"dataset[{index}] raised {type(e).__name__}: {e}"])
            index = None
            tensors = []
            structure = _flatten(collate(samples), tensors) if samples else {"v": None}
            infos, offset = [], 0
            for a in tensors:
                if offset + a.nbytes > size:
                    raise MemoryError(f"a batch of {offset + a.nbytes} bytes: more than the "
                                      f"worker's shared memory ({size} bytes; "
                                      "DataLoader(shared_memory_mb=...))")
                view[offset:offset + a.nbytes] = a.reshape(-1).view(numpy.uint8)
                infos.append({"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                              "bytes": a.nbytes})
                offset += (a.nbytes + 63) // 64 * 64
            answer = {"structure": structure, "tensors": infos, "skipped": skipped}
        except Exception as e:
            where = f"dataset[{index}]" if index is not None else "collate_fn"
            answer = {"error": f"{where} raised {type(e).__name__}: {e} (epoch {epoch}); in the "
                               f"DataLoader worker:\n{traceback.format_exc()}"}
        data = json.dumps(answer).encode()
        os.write(reply, struct.pack("<I", len(data)) + data)
