"""troupe: a C++ actor runtime for heterogeneous clusters, and its data plane for PyTorch.

``troupe.data`` streams batches augmented by troupe's actors on a cluster's data group into a
training script on its dnn group (docs/pytorch.md).
"""

__all__ = ["data"]
