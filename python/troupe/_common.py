"""What troupe.data's modules share: its exceptions, the native module, numpy, and PyTorch found
lazily (troupe.data re-exports the exceptions; import them from there)."""

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


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("troupe.data yields torch tensors: install PyTorch (python3-torch)") from e
    return torch


Stopped.__module__ = JobFailed.__module__ = "troupe.data"
