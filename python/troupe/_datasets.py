"""troupe.data's datasets (re-exported there): Fashion-MNIST as tensors or with troupe's C++
augmentation per sample, and a dataset of any kind decoded and transformed by troupe's C++
transforms (ImageDataset, which DataLoader hands to the C++ path)."""

import warnings

from troupe._common import _native, _torch

def fashion_mnist(split="train", data_dir="/usr/share/datasets/fashion-mnist"):
    """Fashion-MNIST from its Debian package: ``(images, labels)`` as uint8 ``(N, 28, 28)`` and
    int64 ``(N,)`` torch tensors (``split``: "train" or "test")."""
    torch = _torch()
    if split not in ("train", "test"):
        raise ValueError(f"fashion_mnist: split={split!r}: use 'train' or 'test'")
    images, labels = _native.fashion_mnist(split, data_dir)
    return torch.from_numpy(images), torch.from_numpy(labels)


def normalize(images):
    """uint8 pixels to float32 ``(N, 1, 28, 28)``, normalised as the stream's images are."""
    torch = _torch()
    return ((images.float() / 255.0) - 0.2860) / 0.3530


class FashionMNIST:
    """A map-style dataset over Fashion-MNIST's training set, each sample augmented in the
    calling process with troupe's augmenter (the same pipeline as the data group's): what a plain
    PyTorch script uses with ``DataLoader(num_workers=N)`` on its own CPUs."""

    def __init__(self, augment="heavy", train_samples=0,
                 data_dir="/usr/share/datasets/fashion-mnist"):
        torch = _torch()
        images, labels = _native.fashion_mnist("train", data_dir)
        n = train_samples or len(labels)
        self.images, self.labels = images[:n], labels[:n]
        self.augmenter = _native.Augmenter(augment)
        self._torch = torch

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        seed = int(self._torch.randint(0, 2**62, (1,)))
        image = self.augmenter.augment(self.images[index:index + 1], seed)[0]
        return self._torch.from_numpy(image), int(self.labels[index])


class ImageDataset:
    """A map-style dataset over your own images, decoded and transformed in the calling process
    by troupe's C++ pipeline (docs/data.md): an ImageFolder, a manifest (.csv, .jsonl), WebDataset
    .tar shards or Fashion-MNIST's files, found from what is at ``path``, and a transform spec with
    torchvision's names. Each item is ``(tensor, target)``; use it with a DataLoader as any
    dataset::

        ds = troupe.data.ImageDataset("/data/train", "RandomResizedCrop(224),"
                                      "RandomHorizontalFlip(),Normalize(imagenet)")
        for epoch in range(5):
            for x, y in troupe.data.DataLoader(ds, batch_size=64, shuffle=True): ...

    Given to ``troupe.data.DataLoader``, the data group's C++ pipeline decodes and transforms it
    (no Python workers; with a ``worker_init_fn``, in Python workers).

    The random choices of an item: with ``seed``, those of sample ``i`` in epoch ``e`` depend on
    (seed, e, i) only (``set_epoch(e)``; troupe's DataLoader calls it with the script's epoch); in
    a troupe DataLoader without one, on the item's per-sample seed (its pass's base seed and its
    position: the same on the data group, in a local loader and under plain python3); elsewhere
    each call draws a fresh seed from torch, as torchvision's transforms do. A bad spec raises
    ValueError naming what is allowed; a dataset that cannot be used, RuntimeError naming the
    path; a sample that cannot be read or decoded, RuntimeError naming its file.

    ``max_image_pixels`` (default PIL's limit, 178,956,970): an image whose header claims more
    pixels is a sample that cannot be decoded, refused before anything is allocated for it (a
    decompression bomb); 0 removes the limit. Files in class folders that are not images (a
    README.txt, Thumbs.db) are left out, as torchvision's ImageFolder leaves them, with one
    warning saying how many."""

    def __init__(self, path, transform, seed=None, max_image_pixels=None):
        self._torch = _torch()
        self.path, self.spec = str(path), transform
        self.source = _native.open_dataset(str(path))
        for note in self.source.notes:
            warnings.warn(note, stacklevel=2)
        self.transform = _native.Transform(transform)
        if max_image_pixels is not None:
            if int(max_image_pixels) < 0:
                raise ValueError("max_image_pixels=%r: a number of pixels, 0 for no limit" %
                                 (max_image_pixels,))
            self.transform.max_pixels = int(max_image_pixels)
        self.max_image_pixels = self.transform.max_pixels
        self.transform.shape(3)  # a spec that fixes no size, or a wrong Normalize: now, not later
        self.classes = list(self.source.classes)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        """The epoch the next items belong to (with ``seed``: other random choices each epoch)."""
        self.epoch = int(epoch)

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        from troupe import _workers
        if index < 0:
            index += len(self)
        encoded, target = self.source.read(index)
        if self.seed is not None:
            seed = _native.image_seed(int(self.seed), self.epoch, index)
        elif _workers.current_sample_seed is not None:
            seed = _workers.current_sample_seed
        else:
            seed = int(self._torch.randint(0, 2**62, (1,)))
        x = self.transform(encoded, seed, self.source.name(index))
        return self._torch.from_numpy(x), int(target)


FashionMNIST.__module__ = ImageDataset.__module__ = "troupe.data"
