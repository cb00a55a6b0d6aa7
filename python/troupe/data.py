"""Batches for PyTorch from troupe's data group (docs/pytorch.md).

One command runs on every instance (``troupe sim ... -- python3 train.py``, or SageMaker's entry
point). Two ways in:

- :class:`DataLoader`: torch's DataLoader, your own Dataset and its transforms computed by worker
  processes on the data instances; one line of a torch script changes.
- :class:`AugmentedBatches`: batches troupe's C++ augmenters make (Fashion-MNIST's presets, or
  your images through a transform spec, docs/data.md).

The first one a script makes starts the process's troupe job: on the head (the dnn group's first
instance) and the other training instances it returns and the script trains; on every data
instance it never returns - the process serves the data group's work until the job ends, and
exits with the job's exit code, as every troupe process does. Every training sample arrives once
per epoch, counted by the trainer; a lost data instance costs throughput, never samples. When
the job is stopped (SIGTERM on any instance), the next batch raises :class:`Stopped`: save
``state_dict()`` with the model and end; a new run that calls ``load_state_dict()`` first
continues where it stopped. A script that ends with an exception fails the job: every process
exits 1 (JOB_FAILED) and the failure file names the exception.
"""

__all__ = ["AugmentedBatches", "DataLoader", "Stopped", "JobFailed", "StateError",
           "ImageDataset", "FashionMNIST", "fashion_mnist", "normalize"]

# Run by another program on a SageMaker instance (the sagemaker-training toolkit of AWS's images):
# this process becomes the restart loop's parent and runs the script as its child, before anything
# of troupe's is loaded (troupe/_supervise.py). Returns at once everywhere else.
from troupe import _supervise  # noqa: E402

_supervise.run_if_started_by_another()

from troupe import _ddp
from troupe._common import JobFailed, StateError, Stopped  # noqa: F401
from troupe._datasets import FashionMNIST, ImageDataset, fashion_mnist, normalize  # noqa: F401
from troupe._loader import DataLoader  # noqa: F401
from troupe._stream import AugmentedBatches, Epoch  # noqa: F401

_ddp.prepare()  # a data instance's init_process_group(): a world of one (troupe/_ddp.py)
