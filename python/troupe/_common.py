"""What troupe.data's modules share: its exceptions, the native module, numpy, PyTorch found
lazily, the process's streams and how a stream's item becomes a stop or a failure (troupe.data
re-exports the exceptions; import them from there)."""

import atexit
import os
import sys
import traceback


class Stopped(Exception):
    """The job is stopping (SIGTERM or SIGINT on some instance): save the state and end."""


class JobFailed(RuntimeError):
    """The data side failed for good (every augmenter is gone, the trainer failed)."""


try:
    import numpy  # noqa: F401  (the native module returns numpy arrays)
    from troupe import _native
    StateError = _native.StateError
except ImportError as e:  # pragma: no cover - reported to the user as is
    raise ImportError(f"troupe.data needs troupe's native module and numpy: {e}") from e


def interface_to(address):
    """The name of this host's network interface that reaches IPv4 ``address`` (on the host that
    holds it, the interface it is on), or None where it cannot be told. DDP's collectives are
    confined to it (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), as the cluster's private network."""
    import fcntl
    import socket
    import struct
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))  # a UDP connect sends nothing: the kernel picks the route
            local = s.getsockname()[0]
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                if socket.inet_ntoa(packed[20:24]) == local:
                    return name
    except (OSError, UnicodeError):
        return None
    return None


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("troupe.data yields torch tensors: install PyTorch (python3-torch)") from e
    return torch


class Process:
    """This process's streams: each DataLoader (or its one AugmentedBatches) made in a cluster, in
    the order the script makes them; the first starts the troupe job (troupe/train/script_job.h)."""

    streams = 0          # streams made so far
    kinds = []           # "loader" or "augmented", by stream number
    local_rank = False   # a local rank's process (fed by its instance's troupe process)
    local_ranks = []     # the instance's other local ranks this process started (Popen each)

    @classmethod
    def line_buffered(cls):
        # The script's prints a line at a time, as troupe::run() has printf's: under troupe sim or
        # SageMaker stdout is a pipe, and block-buffered lines would come after the log lines.
        sys.stdout.flush()
        sys.stderr.flush()
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)


class Ending:
    """How the script ended, for the job: set by the exception hook, read at exit. The job's
    outcome is the script's process's exit status (python/src/native.cpp, end_at_exit): 0 a
    success; sys.exit(N) or an exception a failure, named."""

    failure = None
    stopped = False
    installed = False

    @classmethod
    def install(cls):
        if cls.installed:
            return
        cls.installed = True
        previous = sys.excepthook

        def hook(kind, value, tb):
            if issubclass(kind, Stopped):
                cls.stopped = True
                print(f"troupe.data: the job was stopped ({value}); the script ended",
                      file=sys.stderr, flush=True)
                return
            # The job's failure reason: the exception (with a DataLoader worker's traceback, which
            # the failure file keeps; log lines show its first line).
            line = traceback.format_exception_only(kind, value)[-1].strip()
            first, _, rest = line.partition("\n")
            cls.failure = (f"{first} (the training script's exception; its traceback is in the "
                           f"log)" + (f"\n{rest}" if rest else ""))
            previous(kind, value, tb)

        sys.excepthook = hook
        atexit.register(cls.end)

    @classmethod
    def end(cls):
        # The rest of Python's exit runs first; the process's status then ends the job.
        sys.stdout.flush()
        sys.stderr.flush()
        _native.end_at_exit(cls.failure or "", cls.stopped)


def stop(on_stop, why="SIGTERM or SIGINT on an instance of the job"):
    """The job is stopping: the script's ``on_stop`` first (it saves the model and
    ``state_dict()`` before the script ends), then :class:`Stopped`."""
    if on_stop is not None:
        on_stop()
    raise Stopped(why)


def next_item(stream, on_stop, normalize=False, timeout=0.0):
    """Stream `stream`'s next item (``_native.next``: a batch, an epoch's end, the end of
    training), or its ending as an exception - the one stop and failure path of every stream:
    a stop calls `on_stop` and raises :class:`Stopped`, a failure raises :class:`JobFailed`,
    and nothing within `timeout` seconds (a DataLoader's ``timeout``; 0: wait) RuntimeError."""
    item = _native.next(stream, normalize, float(timeout))
    kind = item[0]
    if kind == "stopped":
        stop(on_stop)
    if kind == "timeout":
        raise RuntimeError(f"DataLoader timed out after {timeout} seconds")
    if kind == "failed":
        raise worker_exception(item[2]) or JobFailed(f"troupe.data: {item[2]}")
    return item


def worker_exception(text):
    """A DataLoader worker's exception (`text`: the job's failure, the worker's traceback ending
    with its class) as torch's DataLoader re-raises it in the script: of its own class, its message
    `Caught KeyError in DataLoader worker 1 of 2 on algo-2 (dataset[13], epoch 0).` and the
    worker's traceback, so that `except KeyError:` around the loop catches it; also a
    troupe.data.JobFailed where the class allows (the job has failed: every instance exits 1).
    None when the failure is not a worker's exception."""
    from troupe._workers import RAISED_AS, _class_of
    head, marker, path = text.rpartition(RAISED_AS)
    cls = _class_of(path.strip()) if marker else None
    if cls is None or not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    first, _, trace = head.partition("\nin the DataLoader worker:\n")
    # "a training sample could not be read: dataset[13] (file) raised KeyError: why (epoch 0,
    # DataLoader worker 1 of 2 on algo-2)"
    what = first.replace("a training sample could not be read: ", "").split(" raised ", 1)[0]
    epoch, _, worker = first.rpartition(" (")[2].rstrip(")").partition(", ")
    message = (f"Caught {cls.__name__} in {worker or 'a DataLoader worker'} ({what}, {epoch})."
               f"\nin the DataLoader worker:\n{trace.strip()}")
    if cls is KeyError:
        try:  # torch's: a KeyError's str() is its message as written, not its repr
            from torch._utils import KeyErrorMessage
            message = KeyErrorMessage(message)
        except ImportError:
            pass
    try:
        both = type(cls.__name__, (cls, JobFailed), {"__module__": cls.__module__})
        return both(message)
    except TypeError:  # (an instance lay-out conflict, or arguments of its own)
        pass
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - torch falls back to RuntimeError likewise
        return RuntimeError(message)


def debug_logging():
    """Whether troupe logs at debug level (TROUPE_LOG_LEVEL=debug, --log-level debug)."""
    level = os.environ.get("TROUPE_LOG_LEVEL", "")
    return level in ("debug", "trace") or "--log-level=debug" in sys.argv


Stopped.__module__ = JobFailed.__module__ = "troupe.data"
