"""Translation exact or not taken (issue 61): torchvision's ImageFolder with ordinary Composes,
through troupe.data.DataLoader under `troupe sim` (1 data + 1 training instance), against
torchvision's own DataLoader on the same folder, batch for batch (shuffle=False). Every Compose
either is translated (the data group's C++ pipeline; its line says so) and gives torchvision's
tensors within 1 level of 255, or runs in Python workers with its one line and gives torchvision's
tensors exactly; every target is the dataset's own. The folder holds JPEGs of many sizes (some
large enough for DCT-scaled decoding to apply) and a dataset_info.json beside the class folders.
Also: a folder with a file symlink loop is listed as torchvision lists it, and skip_errors leaves
that one file out; decode_scaling=True is translated, says so, and differs from torchvision's
pixels (the knob works).

    translate_check.py --build BUILD

Exits 1 on a failure (its first line says which case), 77 without torch/torchvision/PIL.
"""
import argparse
import json
import os
import re
import sys
import tempfile

import sim_check

SCRIPT = r'''
import json, os, sys, traceback
import torch, torchvision
import torchvision.transforms as T
from troupe.data import DataLoader
from cases import CASES, dataset_of

out = os.environ["TRANSLATE_OUT"]
for name in sorted(CASES):
    try:
        ds, kwargs = dataset_of(name, os.environ["TRANSLATE_ROOT"])
        loader = DataLoader(ds, batch_size=16, shuffle=False, num_workers=2, **kwargs)
        xs, ys = [], []
        for x, y in loader:
            xs.append(x)
            ys.append(y)
        torch.save({"x": torch.cat(xs), "y": torch.cat(ys)}, os.path.join(out, name + ".pt"))
        print(f"translate_check: case {name} done", flush=True)
    except Exception:
        with open(os.path.join(out, name + ".error"), "w") as f:
            f.write(traceback.format_exc())
        print(f"translate_check: case {name} raised", flush=True)
'''

CASES = r'''
import os
import torchvision
import torchvision.transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# name: (the Compose, the dataset's variant, the DataLoader's extra arguments, the path expected)
CASES = {
    "resize_crop": "translated",
    "totensor_first": "python",
    "relabelled": "python",
    "find_classes": "python",
    "affine_fill": "python",
    "affine_fill0": "translated",
    "symlink_loop": "python",
    "decode_scaling": "translated",
}


class Reversed(torchvision.datasets.ImageFolder):
    """A subclass with a find_classes of its own: classes in reverse order."""

    def find_classes(self, directory):
        classes = sorted((e.name for e in os.scandir(directory) if e.is_dir()), reverse=True)
        return classes, {c: i for i, c in enumerate(classes)}


def dataset_of(name, root):
    resize = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    kwargs = {}
    folder = os.path.join(root, "images")
    if name in ("resize_crop", "decode_scaling"):
        ds = torchvision.datasets.ImageFolder(folder, transform=resize)
        if name == "decode_scaling":
            kwargs["decode_scaling"] = True
    elif name == "totensor_first":
        ds = torchvision.datasets.ImageFolder(folder, transform=T.Compose(
            [T.ToTensor(), T.Resize(64), T.CenterCrop(64), T.Normalize(MEAN, STD)]))
    elif name == "relabelled":
        ds = torchvision.datasets.ImageFolder(folder, transform=resize)
        remap = {0: 2, 1: 0, 2: 1}
        ds.samples = [(p, remap[t]) for p, t in ds.samples]
        ds.targets = [t for _, t in ds.samples]
    elif name == "find_classes":
        ds = Reversed(folder, transform=resize)
    elif name == "affine_fill":
        ds = torchvision.datasets.ImageFolder(folder, transform=T.Compose(
            [T.Resize(64), T.CenterCrop(64), T.RandomAffine(0, fill=128), T.ToTensor()]))
    elif name == "affine_fill0":
        ds = torchvision.datasets.ImageFolder(folder, transform=T.Compose(
            [T.Resize(64), T.CenterCrop(64), T.RandomAffine(0, fill=0), T.ToTensor()]))
    elif name == "symlink_loop":
        ds = torchvision.datasets.ImageFolder(os.path.join(root, "looped"), transform=resize)
        kwargs["skip_errors"] = True
    return ds, kwargs
'''


def make_folders(root):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(61)
    sizes = [(160, 120), (120, 160), (97, 131), (200, 150), (400, 300), (640, 480), (150, 151),
             (333, 250)]
    for top in ("images", "looped"):
        for c, cls in enumerate(("cat", "dog", "emu")):
            os.makedirs(os.path.join(root, top, cls))
            for i in range(32 if top == "images" else 4):
                w, h = sizes[(i + c) % len(sizes)]
                y, x = np.mgrid[0:h, 0:w]
                img = np.stack([(x * 7 + c * 40) % 256, (y * 5 + i * 3) % 256, (x * y) % 256], -1)
                img = (img + rng.integers(0, 60, img.shape)).clip(0, 255).astype(np.uint8)
                Image.fromarray(img, "RGB").save(os.path.join(root, top, cls, f"{i:03d}.jpg"),
                                                 quality=90)
        # torchvision's ImageFolder takes a root with a file beside its class folders.
        with open(os.path.join(root, top, "dataset_info.json"), "w") as f:
            json.dump({"made_by": "translate_check.py"}, f)
    os.symlink("zz.jpg", os.path.join(root, "looped", "emu", "zz.jpg"))  # a loop onto itself


def levels(a, b, normalized):
    """The largest difference in levels of 255 (of the unnormalised pixels)."""
    import torch
    d = (a.double() - b.double()).abs()
    if normalized:
        std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).view(1, 3, 1, 1)
        d = d * std
    return float(d.max()) * 255 if d.numel() else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    try:
        import torch
        import torchvision  # noqa: F401
        import PIL  # noqa: F401
    except ImportError as e:
        print(f"skipping: cannot import torch, torchvision and PIL: {e}")
        return 77
    build = os.path.abspath(args.build)
    failures = []
    with tempfile.TemporaryDirectory(prefix="translate-check-") as tmp:
        root, out = os.path.join(tmp, "data"), os.path.join(tmp, "out")
        os.makedirs(out)
        make_folders(root)
        with open(os.path.join(tmp, "cases.py"), "w") as f:
            f.write(CASES)
        with open(os.path.join(tmp, "script.py"), "w") as f:
            f.write(SCRIPT)
        sys.path.insert(0, tmp)
        from cases import CASES as cases, dataset_of
        env = sim_check.environment(build, paths=[tmp], TRANSLATE_OUT=out, TRANSLATE_ROOT=root)
        code, output = sim_check.sim(build, os.path.join(tmp, "script.py"), env)
        print(f"troupe sim exited {code}")
        if code != 0:
            failures.append(f"the job exited {code}; its output's end:\n" + output[-3000:])
        # Which path each loader took, in the order the script made them (sorted case names).
        lines = re.findall(r"troupe\.data: DataLoader (\d+): (.*)", output)
        said = {}
        for number, line in lines:
            said.setdefault(int(number), line)
        for k, name in enumerate(sorted(cases)):
            expected = cases[name]
            line = said.get(k, "")
            path = ("translated" if "C++ pipeline:" in line else
                    "python" if "Python workers:" in line else "unknown")
            error = os.path.join(out, name + ".error")
            if os.path.exists(error):
                with open(error) as f:
                    failures.append(f"{name}: the DataLoader raised where torchvision's does "
                                    f"not:\n{f.read()[-1500:]}")
                continue
            if path != expected:
                failures.append(f"{name}: took the {path} path (expected {expected}): {line!r}")
            got = torch.load(os.path.join(out, name + ".pt"))
            ds, kwargs = dataset_of(name, root)
            if name == "symlink_loop":
                # torchvision lists the loop and fails on loading it; skipping leaves it out.
                keep = [i for i, (p, _) in enumerate(ds.samples) if not p.endswith("zz.jpg")]
                ds = torch.utils.data.Subset(ds, keep)
            want_x, want_y = [], []
            for x, y in torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False):
                want_x.append(x)
                want_y.append(y)
            want_x, want_y = torch.cat(want_x), torch.cat(want_y)
            if got["y"].tolist() != want_y.tolist():
                failures.append(f"{name}: targets differ from the dataset's own: "
                                f"{got['y'].tolist()[:12]}... against {want_y.tolist()[:12]}...")
                continue
            if got["x"].shape != want_x.shape:
                failures.append(f"{name}: shape {tuple(got['x'].shape)}, torchvision's "
                                f"{tuple(want_x.shape)}")
                continue
            off = levels(got["x"], want_x, not name.startswith("affine_fill"))
            limit = 1.0 if expected == "translated" else 1e-3
            verdict = "ok  "
            if name == "decode_scaling":
                # The knob's own figure: DCT-scaled decodes are not PIL's pixels.
                verdict = "ok  " if off > 1.0 else "FAIL"
                if off <= 1.0:
                    failures.append(f"{name}: decode_scaling=True gave torchvision's pixels "
                                    f"({off:.2f} levels): DCT scaling did not apply")
            elif off > limit:
                verdict = "FAIL"
                failures.append(f"{name}: up to {off:.2f} levels of 255 off torchvision's "
                                f"(at most {limit:g} on the {expected} path)")
            print(f"{verdict} {name}: {path} path, {len(want_y)} samples, targets the dataset's, "
                  f"max {off:.2f} levels of 255 off torchvision's: {line[:110]}")
    return sim_check.verdict("translate_check", failures, "every Compose gave torchvision's "
                             "tensors and targets, translated or in Python workers, each said")


if __name__ == "__main__":
    sys.exit(main())
