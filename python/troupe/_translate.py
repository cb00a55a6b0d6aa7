"""A torchvision ImageFolder's transform on troupe's C++ pipeline (docs/pytorch.md).

``troupe.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=T.Compose([...])))``:
where the dataset is torchvision's own ImageFolder (or DatasetFolder with its default loader and
image extensions), unchanged, and every transform of its Compose is one troupe's pipeline runs
(troupe/images/transforms.h: torchvision's names and arguments, PIL's pixels), the data group
decodes and transforms its images in C++ instead of Python workers. ``translate(dataset)`` says
which, and why: the spec, or the first thing it cannot translate."""

import os


class Untranslatable(Exception):
    """Why a dataset's transforms stay in Python, on one line."""


def is_folder(dataset):
    """Whether `dataset` is torchvision's DatasetFolder (ImageFolder) or a subclass: what the
    script may expect translated, and is told about when it is not."""
    try:
        from torchvision.datasets import folder
    except Exception:  # noqa: BLE001 - no torchvision: not one
        return False
    return isinstance(dataset, folder.DatasetFolder)


def _pair(value):
    """torchvision's size: an int, or a sequence of one or two."""
    if isinstance(value, int):
        return (value, value)
    value = list(value)
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _range(values):
    return "(%r, %r)" % (float(values[0]), float(values[1]))


def _bilinear(t, name):
    from torchvision.transforms import InterpolationMode
    if t.interpolation != InterpolationMode.BILINEAR:
        raise Untranslatable("%s(interpolation=%s): troupe resamples bilinearly only" %
                             (name, t.interpolation.value))


def _one(t):
    """The spec of one torchvision transform, or Untranslatable."""
    import torch
    import torchvision.transforms as T
    kind = type(t)
    if kind is T.RandomResizedCrop:
        _bilinear(t, "RandomResizedCrop")
        h, w = _pair(t.size)
        return "RandomResizedCrop(size=(%d, %d), scale=%s, ratio=%s)" % (h, w, _range(t.scale),
                                                                         _range(t.ratio))
    if kind is T.Resize:
        _bilinear(t, "Resize")
        if t.max_size is not None:
            raise Untranslatable("Resize(max_size=%r): troupe's Resize has no max_size" %
                                 (t.max_size,))
        if isinstance(t.size, int) or len(t.size) == 1:
            return "Resize(%d)" % (t.size if isinstance(t.size, int) else t.size[0])
        return "Resize((%d, %d))" % tuple(t.size)
    if kind is T.CenterCrop:
        return "CenterCrop((%d, %d))" % _pair(t.size)
    if kind in (T.RandomHorizontalFlip, T.RandomVerticalFlip):
        return "%s(p=%r)" % (kind.__name__, float(t.p))
    if kind is T.ColorJitter:
        parts = ["%s=%s" % (name, _range(getattr(t, name)))
                 for name in ("brightness", "contrast", "saturation", "hue")
                 if getattr(t, name) is not None]
        return "ColorJitter(%s)" % ", ".join(parts)
    if kind is T.RandomAffine:
        from torchvision.transforms import InterpolationMode
        if t.interpolation != InterpolationMode.NEAREST:
            raise Untranslatable("RandomAffine(interpolation=%s): troupe's is nearest only" %
                                 t.interpolation.value)
        fills = t.fill if isinstance(t.fill, (list, tuple)) else [t.fill or 0]
        if t.center is not None or any(float(f) != 0 for f in fills):
            raise Untranslatable("RandomAffine(center=..., fill=...): troupe's turns about the "
                                 "centre and fills with zeros")
        parts = ["degrees=%s" % _range(t.degrees)]
        if t.translate is not None:
            parts.append("translate=%s" % _range(t.translate))
        if t.scale is not None:
            parts.append("scale=%s" % _range(t.scale))
        if t.shear is not None:
            parts.append("shear=(%s)" % ", ".join(repr(float(s)) for s in t.shear))
        return "RandomAffine(%s)" % ", ".join(parts)
    if kind is T.GaussianBlur:
        return "GaussianBlur(kernel_size=(%d, %d), sigma=%s)" % (tuple(t.kernel_size) +
                                                                 (_range(t.sigma),))
    if kind is T.Grayscale:
        return "Grayscale(num_output_channels=%d)" % t.num_output_channels
    if kind is T.ToTensor:
        return "ToTensor()"
    if kind is T.Normalize:
        mean, std = list(t.mean), list(t.std)
        return "Normalize(mean=(%s), std=(%s))" % (", ".join(repr(float(m)) for m in mean),
                                                  ", ".join(repr(float(s)) for s in std))
    if kind is T.ConvertImageDtype and t.dtype in (torch.float16, torch.float32):
        return "ToDtype(%s)" % str(t.dtype).replace("torch.", "")
    raise Untranslatable("%s is not a transform troupe's pipeline runs (docs/data.md lists "
                         "them)" % kind.__name__)


def spec_of(transform):
    """The spec of a torchvision Compose (or one transform), or Untranslatable."""
    import torchvision.transforms as T
    if transform is None:
        raise Untranslatable("no transform: its items are PIL images, which a batch cannot hold")
    steps = transform.transforms if type(transform) is T.Compose else [transform]
    # The written order kept: torchvision runs what follows ToTensor on a tensor (its tensor
    # semantics: another resampling, no PIL rounding), troupe's pipeline on the image.
    tensors = False
    for t in steps:
        kind = type(t)
        if tensors and kind not in (T.Normalize, T.ConvertImageDtype):
            raise Untranslatable("%s after ToTensor: torchvision runs it on a tensor, troupe's "
                                 "pipeline on the PIL image (other pixels)" % kind.__name__)
        if not tensors and kind in (T.Normalize, T.ConvertImageDtype):
            raise Untranslatable("%s before ToTensor: it takes a tensor" % kind.__name__)
        if kind is T.ToTensor:
            if tensors:
                raise Untranslatable("ToTensor twice")
            tensors = True
    specs = [_one(t) for t in steps]
    # Normalize implies ToTensor in troupe's spec; torchvision's has both.
    if "ToTensor()" in specs and any(s.startswith("Normalize(") for s in specs):
        specs.remove("ToTensor()")
    if not any(s.startswith(("ToTensor(", "Normalize(")) for s in specs):
        raise Untranslatable("the transform ends without ToTensor or Normalize: its items are "
                             "PIL images, which a batch cannot hold")
    return ",".join(specs)


class Translated:
    """A dataset translated: its root, the spec, and PIL's pixel limit as troupe takes it."""

    def __init__(self, path, spec, max_image_pixels):
        self.path, self.spec, self.max_image_pixels = path, spec, max_image_pixels
        self.seed = None


def translate(dataset):
    """A Translated for torchvision's ImageFolder and its Compose, or Untranslatable saying why
    it stays in Python."""
    try:
        from torchvision.datasets import folder
    except Exception as e:
        raise Untranslatable("torchvision cannot be imported: %s" % e) from e
    kind = type(dataset)
    if not isinstance(dataset, folder.DatasetFolder):
        raise Untranslatable("%s is not torchvision's ImageFolder" % kind.__name__)
    if kind.__getitem__ is not folder.DatasetFolder.__getitem__:
        raise Untranslatable("%s overrides ImageFolder's __getitem__" % kind.__name__)
    if dataset.loader is not folder.default_loader:
        raise Untranslatable("the dataset's loader is not torchvision's default_loader")
    if dataset.target_transform is not None:
        raise Untranslatable("a target_transform (troupe's targets are the class indices)")
    extensions = getattr(dataset, "extensions", None)
    if extensions is not None and tuple(extensions) != tuple(folder.IMG_EXTENSIONS):
        raise Untranslatable("extensions=%r: troupe's ImageFolder reads torchvision's image "
                             "extensions" % (extensions,))
    spec = spec_of(dataset.transform)
    from troupe._common import _native
    try:
        _native.Transform(spec).shape(3)
    except ValueError as e:
        raise Untranslatable(str(e)) from e
    # The samples as troupe lists the folder: the same files in the same order with the same
    # targets, else (a subset, samples relabelled after it was made, a find_classes of its own)
    # the dataset's own list stays in Python. A folder troupe cannot list (a symlink loop, a
    # file it cannot read) too: torchvision fails only on loading the one file, and so do the
    # workers.
    root = str(dataset.root)
    try:
        source = _native.open_image_folder(root)
    except Exception as e:  # noqa: BLE001 - any reason to stay in Python, on its line
        raise Untranslatable("troupe's C++ pipeline cannot list it: %s" % e) from e
    classes = list(source.classes)
    if len(source) != len(dataset.samples) or classes != list(dataset.classes):
        raise Untranslatable("its samples are not the folder's as troupe lists it (%d files in "
                             "%d classes there, %d samples in %d classes in the dataset)" %
                             (len(source), len(classes), len(dataset.samples),
                              len(dataset.classes)))
    index = {name: i for i, name in enumerate(classes)}
    base = os.path.normpath(root)
    for i, (path, target) in enumerate(dataset.samples):
        name = os.path.normpath(source.name(i))
        if name != os.path.normpath(path):
            raise Untranslatable("its samples are not the folder's as troupe lists it (sample "
                                 "%d is %s, the folder's %s)" % (i, path, name))
        folder = os.path.relpath(name, base).split(os.sep)[0]
        if index.get(folder) != target:
            raise Untranslatable("its targets are not its folders' in sorted order (sample %d, "
                                 "%s, has target %r; its folder %r is class %r): samples "
                                 "relabelled, or a find_classes of its own" %
                                 (i, path, target, folder, index.get(folder)))
    from PIL import Image
    limit = Image.MAX_IMAGE_PIXELS
    # PIL refuses above twice its limit (DecompressionBombError); None: no limit.
    return Translated(root, spec, 0 if limit is None else 2 * int(limit))
