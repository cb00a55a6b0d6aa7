"""troupe's image pipeline (troupe._native.Transform, docs/data.md) against torchvision 0.14 on the
same images: the deterministic transforms (Resize, the shorter side and an exact size; CenterCrop,
smaller and larger than the image; a flip with p=1; ToTensor and Normalize), then the random ones
with their ranges pinned so both draw the same (RandomAffine, GaussianBlur, ColorJitter's four,
Grayscale, RandomResizedCrop over the whole image), each within 2 levels of 255 on average. Then
files as PIL decodes them (a JPEG with stray bytes, a 16-bit grey PNG, CMYK and YCCK JPEGs, a
decompression bomb), and a
dataset on disk through troupe._native.open_dataset, in torchvision's ImageFolder order, with a
README.txt and a Thumbs.db torchvision leaves out.

Images: PNGs made here with PIL, so both sides decode the same pixels; a JPEG's decoders may
round differently. Prints one line per comparison and exits 1 on the first that is off.
Exits 0 with "skipping: ..." where torch, torchvision or PIL cannot be imported.

Usage: python3 transforms_check.py   (with troupe's build/python on PYTHONPATH)
"""
import io
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torchvision
    import torchvision.transforms as T
    from PIL import Image
except Exception as e:  # noqa: BLE001 - any import failure is a skip, said with its reason
    print(f"skipping: cannot import numpy, torch, torchvision and PIL: {e}")
    sys.exit(0)

from troupe import _native  # a broken package is a failure, never a skip

failures = 0


def picture(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(1, w - 1), y * 255 // max(1, h - 1), (x + y) % 256], axis=-1)
    img = (img + rng.integers(0, 40, size=img.shape)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(img, "RGB")


def png(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def compare(what, ours, theirs, max_abs, mean_abs):
    global failures
    ours = np.asarray(ours, dtype=np.float64)
    theirs = np.asarray(theirs, dtype=np.float64)
    if ours.shape != theirs.shape:
        print(f"FAIL {what}: shape {ours.shape}, torchvision {theirs.shape}")
        failures += 1
        return
    diff = np.abs(ours - theirs)
    ok = diff.max() <= max_abs and diff.mean() <= mean_abs
    print(f"{'ok  ' if ok else 'FAIL'} {what}: shape {ours.shape}, max |diff| {diff.max():.4g} "
          f"(allowed {max_abs}), mean {diff.mean():.4g} (allowed {mean_abs})")
    failures += 0 if ok else 1


def hwc(tensor_chw):
    return (tensor_chw.permute(1, 2, 0).numpy() * 255).round()


print(f"torchvision {torchvision.__version__}, torch {torch.__version__}")
for (w, h) in [(500, 375), (97, 131), (40, 30)]:
    img = picture(w, h, w)
    data = png(img)
    size = f"{w}x{h}"
    # Exact: crops and flips move pixels; ToTensor and Normalize are arithmetic.
    for crop in [(24, 24), (min(h, 64), min(w, 48)), (h + 6, w + 5)]:
        spec = f"CenterCrop(({crop[0]}, {crop[1]}))"
        ours = _native.Transform(spec)(data)
        theirs = np.asarray(T.CenterCrop(crop)(img))
        compare(f"{size} {spec}", ours, theirs, 0, 0)
    spec = "CenterCrop((20, 30)),RandomHorizontalFlip(p=1),RandomVerticalFlip(p=1)"
    ours = _native.Transform(spec)(data)
    theirs = np.asarray(T.Compose([T.CenterCrop((20, 30)), T.RandomHorizontalFlip(p=1),
                                   T.RandomVerticalFlip(p=1)])(img))
    compare(f"{size} {spec}", ours, theirs, 0, 0)
    # (24 wide: 16 pixels a group where the CPU has AVX2, then 8 one by one)
    spec = "CenterCrop(24),Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))"
    ours = _native.Transform(spec)(data)
    theirs = T.Compose([T.CenterCrop(24), T.ToTensor(),
                        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])(img).numpy()
    compare(f"{size} {spec}", ours, theirs, 1e-5, 1e-6)
    # Resampling: troupe's is PIL's antialiased bilinear written again (resample.cpp): the same
    # size and the same pixels (measured: max 0; one level allowed for a PIL built otherwise).
    for spec, tv in [("Resize(24),CenterCrop(24)", T.Compose([T.Resize(24), T.CenterCrop(24)])),
                     ("Resize((32, 40))", T.Resize((32, 40))),
                     ("Resize((2 * h, 2 * w))".replace("2 * h", str(2 * h)).replace("2 * w", str(2 * w)),
                      T.Resize((2 * h, 2 * w)))]:
        ours = _native.Transform(spec)(data)
        theirs = np.asarray(tv(img))
        compare(f"{size} {spec}", ours, theirs, 1, 0.01)
    # Resize(int) keeps the aspect ratio as torchvision computes it.
    ours = _native.Transform("Resize(20),ToTensor()")
    try:
        ours.shape(3)
        print("FAIL Resize(20) alone should not fix the output's size")
        failures += 1
    except ValueError:
        pass
    want = T.Resize(20)(img).size  # (w, h)
    got = _native.Transform("Resize(20)").image(np.asarray(img), 0).shape  # (h, w, c)
    ok = (got[1], got[0]) == want
    print(f"{'ok  ' if ok else 'FAIL'} {size} Resize(20): {got[1]}x{got[0]}, torchvision {want[0]}x{want[1]}")
    failures += 0 if ok else 1

# The random transforms, their ranges pinned: both sides draw the same, so the pixels must agree
# (mean within 2 levels of 255; the max is printed, not judged: one pixel on an edge may round
# the other way). ColorJitter, Grayscale and the crop compute as PIL does, to the level (color.cpp,
# resample.cpp): exact.
for (w, h) in [(97, 131), (160, 120)]:
    img = picture(w, h, 3)
    arr = np.asarray(img)
    pinned = [
        ("RandomAffine(degrees=(30, 30))", T.RandomAffine(degrees=(30, 30))),
        ("RandomAffine(degrees=(-20, -20), scale=(1.2, 1.2), shear=(10, 10))",
         T.RandomAffine(degrees=(-20, -20), scale=(1.2, 1.2), shear=(10, 10))),
        ("RandomAffine(degrees=(0, 0), shear=(5, 5, -8, -8))",
         T.RandomAffine(degrees=(0, 0), shear=(5, 5, -8, -8))),
        ("GaussianBlur(kernel_size=(3, 9), sigma=(1.5, 1.5))",
         T.GaussianBlur((3, 9), sigma=(1.5, 1.5))),
        ("GaussianBlur(5, sigma=0.8)", T.GaussianBlur(5, sigma=0.8)),
        ("ColorJitter(brightness=(1.4, 1.4))", T.ColorJitter(brightness=(1.4, 1.4))),
        ("ColorJitter(contrast=(0.6, 0.6))", T.ColorJitter(contrast=(0.6, 0.6))),
        ("ColorJitter(saturation=(1.5, 1.5))", T.ColorJitter(saturation=(1.5, 1.5))),
        ("ColorJitter(hue=(0.1, 0.1))", T.ColorJitter(hue=(0.1, 0.1))),
        ("Grayscale()", T.Grayscale()),
        ("Grayscale(3)", T.Grayscale(3)),
        (f"RandomResizedCrop(({h // 2}, {w // 2}), scale=(1, 1), ratio=({w / h}, {w / h}))",
         T.RandomResizedCrop((h // 2, w // 2), scale=(1, 1), ratio=(w / h, w / h))),
    ]
    for spec, tv in pinned:
        ours = _native.Transform(spec).image(arr, 5).astype(np.float64)
        theirs = np.asarray(tv(img)).astype(np.float64).reshape(ours.shape)
        exact = spec.startswith(("ColorJitter", "Grayscale", "RandomResizedCrop"))
        compare(f"{w}x{h} {spec}", ours, theirs, 0 if exact else 255, 0 if exact else 2.0)
# The dtype and the layout: ToDtype(float16) is ToTensor's values as half floats (torch's
# .half()), ChannelsLast the same values as H x W x C (torchvision has no such transform: the
# tensor permuted).
img = picture(40, 30, 6)
data = png(img)
tensor = T.ToTensor()(img)
compare("ToTensor(),ToDtype(float16)", _native.Transform("CenterCrop((30, 40)),ToTensor(),ToDtype(float16)")(data)
        .astype(np.float32), tensor.half().float().numpy(), 0, 0)
compare("ToTensor(),ChannelsLast()", _native.Transform("CenterCrop((30, 40)),ToTensor(),ChannelsLast()")(data),
        tensor.permute(1, 2, 0).numpy(), 1e-6, 1e-7)  # x / 255 as a product: an ulp apart

# Arguments as torchvision reads them: translate's fractions need not be ordered; scale is a pair.
for spec, takes in [("RandomAffine(0, translate=(0.2, 0.1))", True),
                    ("RandomAffine(0, scale=1.2)", False)]:
    try:
        _native.Transform(spec)
        ok = takes
    except ValueError:
        ok = not takes
    print(f"{'ok  ' if ok else 'FAIL'} {spec}: {'taken' if takes else 'refused'}, as torchvision")
    failures += 0 if ok else 1

# Files as PIL decodes them.
def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def ours_rgb(data, w, h, name="<bytes>"):
    return _native.Transform(f"CenterCrop(({h}, {w}))")(data, 0, name)


jpeg = io.BytesIO()
picture(90, 70, 4).save(jpeg, format="JPEG", quality=90)
stray = jpeg.getvalue()[:-2] + bytes(8) + jpeg.getvalue()[-2:]
compare("a JPEG with 8 stray bytes before its end marker, against PIL", ours_rgb(stray, 90, 70),
        pil_rgb(stray), 255, 1.0)
grey16 = io.BytesIO()
Image.fromarray((np.arange(60 * 40).reshape(40, 60) * 7 % 700).astype(np.uint16)).save(grey16, format="PNG")
compare("a 16-bit grey PNG (values 0..699), against PIL", ours_rgb(grey16.getvalue(), 60, 40),
        pil_rgb(grey16.getvalue()), 0, 0)
# CMYK JPEGs (PIL's, with Adobe's marker, and the same without it) and a YCCK JPEG (made by
# TurboJPEG from CMYK pixels, as Photoshop writes them): exactly PIL's RGB, in every build.
cmyk = io.BytesIO()
picture(64, 48, 5).convert("CMYK").save(cmyk, format="JPEG", quality=92)


def without_app14(data):
    out, at = bytearray(data[:2]), 2
    while at + 4 <= len(data) and data[at + 1] != 0xDA:
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if data[at + 1] != 0xEE:
            out += data[at:at + 2 + length]
        at += 2 + length
    return bytes(out + data[at:])


def ycck_jpeg(w, h, seed):
    """A YCCK JPEG through libturbojpeg (ctypes): TJPF_CMYK pixels compressed; None where the
    library cannot be loaded."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        tj = ctypes.CDLL(name)
    except OSError:
        return None
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8)
    pixels[:, :, 3] //= 3  # little black: colours the conversion has to get right
    out, size = ctypes.POINTER(ctypes.c_ubyte)(), ctypes.c_ulong(0)
    rc = tj.tjCompress2(handle, pixels.ctypes.data_as(ctypes.c_void_p), w, 0, h, 11,  # TJPF_CMYK
                        ctypes.byref(out), ctypes.byref(size), 2, 90, 0)  # 4:2:0
    data = bytes(out[:size.value]) if rc == 0 else None
    tj.tjFree(out)
    tj.tjDestroy(handle)
    return data


for what, data in (("a CMYK JPEG with Adobe's marker", cmyk.getvalue()),
                   ("a CMYK JPEG without Adobe's marker", without_app14(cmyk.getvalue())),
                   ("a YCCK JPEG", ycck_jpeg(64, 48, 6))):
    if data is None:
        print(f"FAIL {what}: libturbojpeg could not be loaded to make it")
        failures += 1
        continue
    assert Image.open(io.BytesIO(data)).mode == "CMYK", what
    compare(f"{what}, against PIL", ours_rgb(data, 64, 48), pil_rgb(data), 0, 0)
bomb = bytearray(jpeg.getvalue())
sof = bomb.index(b"\xff\xc0")
bomb[sof + 5:sof + 9] = (65000).to_bytes(2, "big") * 2
try:
    Image.open(io.BytesIO(bytes(bomb))).load()
    pil = "decoded"
except Image.DecompressionBombError:
    pil = "DecompressionBombError"
try:
    ours_rgb(bytes(bomb), 90, 70, "bomb.jpg")
    said = "decoded"
except RuntimeError as e:
    said = str(e)
ok = pil == "DecompressionBombError" and "bomb.jpg" in said and "65000 x 65000" in said
print(f"{'ok  ' if ok else 'FAIL'} a header claiming 65000 x 65000: PIL {pil}, troupe: {said[:110]}")
failures += 0 if ok else 1

# The same seed, the same pixels; a spec with a typo names what is allowed.
t = _native.Transform("RandomResizedCrop(32),ColorJitter(0.4, 0.4, 0.4),Normalize(imagenet)")
data = png(picture(120, 90, 1))
same = np.array_equal(t(data, 7), t(data, 7)) and not np.array_equal(t(data, 7), t(data, 8))
print(f"{'ok  ' if same else 'FAIL'} same seed, same pixels; another seed, others")
failures += 0 if same else 1
try:
    _native.Transform("RandomResizeCrop(224)")
    print("FAIL a misspelt transform was accepted")
    failures += 1
except ValueError as e:
    ok = "did you mean RandomResizedCrop?" in str(e)
    print(f"{'ok  ' if ok else 'FAIL'} a typo: {e}")
    failures += 0 if ok else 1

# A dataset on disk in torchvision's ImageFolder order, targets and bytes.
with tempfile.TemporaryDirectory() as root:
    for cls, names in {"zebra": ["b.png", "a.png"], "ant": ["c.png"], "moth": ["d.png", "e.png"]}.items():
        os.makedirs(os.path.join(root, cls, "sub"), exist_ok=True)
        for i, n in enumerate(names):
            picture(20 + i, 10 + i, i).save(os.path.join(root, cls, n))
    picture(8, 8, 9).save(os.path.join(root, "moth", "sub", "f.png"))
    with open(os.path.join(root, "ant", "README.txt"), "w") as f:
        f.write("ants, 2019\n")
    with open(os.path.join(root, "moth", "Thumbs.db"), "wb") as f:
        f.write(b"\0" * 64)
    ours = _native.open_dataset(root)
    theirs = torchvision.datasets.ImageFolder(root)
    ok = (ours.kind == "ImageFolder" and list(ours.classes) == theirs.classes and len(ours) == len(theirs)
          and all(ours.name(i) == theirs.samples[i][0] and ours.read(i)[1] == theirs.samples[i][1]
                  for i in range(len(ours))))
    print(f"{'ok  ' if ok else 'FAIL'} ImageFolder: {len(ours)} samples, classes {list(ours.classes)}, "
          f"order and targets as torchvision's")
    failures += 0 if ok else 1
    notes = list(ours.notes)
    ok = len(notes) == 1 and "left out 2 file(s)" in notes[0] and "Thumbs.db" in notes[0]
    print(f"{'ok  ' if ok else 'FAIL'} a README.txt and a Thumbs.db left out, as torchvision, and "
          f"said: {notes}")
    failures += 0 if ok else 1

    # The same folder as a torch dataset through troupe.data (the C++ pipeline in this process).
    import troupe.data
    import warnings
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = troupe.data.ImageDataset(root, "Resize((12, 16)),RandomHorizontalFlip(),ToTensor()",
                                      seed=3)
    ok = (len(said) == 1 and "left out 2 file(s)" in str(said[0].message)
          and ds.max_image_pixels == 178956970
          and troupe.data.ImageDataset(root, "Resize((12, 16))", max_image_pixels=0).max_image_pixels == 0)
    print(f"{'ok  ' if ok else 'FAIL'} ImageDataset warns once of the files left out; "
          f"max_image_pixels {ds.max_image_pixels} by default, 0 taken")
    failures += 0 if ok else 1
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4))
    again = list(torch.utils.data.DataLoader(ds, batch_size=4))
    ds.set_epoch(1)
    other = list(torch.utils.data.DataLoader(ds, batch_size=4))
    ok = (len(ds) == 6 and ds.classes == theirs.classes and batches[0][0].shape == (4, 3, 12, 16)
          and batches[0][0].dtype == torch.float32 and batches[1][0].shape == (2, 3, 12, 16)
          and batches[0][1].tolist() == [t for _, t in theirs.samples[:4]]
          and all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
          and not all(torch.equal(a[0], b[0]) for a, b in zip(batches, other)))
    print(f"{'ok  ' if ok else 'FAIL'} troupe.data.ImageDataset in a DataLoader: shapes, targets, "
          f"the same seed and epoch the same tensors, another epoch others")
    failures += 0 if ok else 1
    try:
        troupe.data.ImageDataset(root, "Resize(12)")
        print("FAIL ImageDataset took a spec that fixes no size")
        failures += 1
    except ValueError as e:
        print(f"ok   ImageDataset refuses a spec that fixes no size: {str(e)[:80]}...")

print(f"{failures} comparison(s) off")
sys.exit(1 if failures else 0)
