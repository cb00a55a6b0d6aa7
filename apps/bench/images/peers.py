"""bench_images' peers: the other image libraries people feed a trainer with, each running
ImageNet's training recipe (RandomResizedCrop(224), RandomHorizontalFlip(),
ColorJitter(0.4, 0.4, 0.4), ToTensor(), Normalize(ImageNet)) on one thread, timed over the same
JPEGs as bench_images' own rows.

    peers.py --mode MODE --files LISTFILE [--warmup 20]

LISTFILE names one JPEG a line. Modes:

    torchvision   PIL's Image.open().convert("RGB") and the recipe composed in torchvision
    opencv        cv2.imdecode, BGR -> RGB, then the recipe in cv2 and numpy (Recipe below: cv2's
                  bilinear resize and saturating uint8 blends, what is fastest in them)
    simplejpeg    simplejpeg.decode_jpeg to RGB, then Recipe
    pyturbojpeg   PyTurboJPEG's decode to RGB, then Recipe
    dali          NVIDIA DALI's CPU pipeline: decoders.image_random_crop (decodes the crop only),
                  resize, color_twist, crop_mirror_normalize, in batches of DALI_BATCH
    spdl          SPDL's demux_image + decode_packets, FFmpeg's crop and scale filters in the
                  decode, then Recipe's flip, jitter and normalization

Every mode but torchvision decodes bytes read into memory before timing (torchvision opens the
files by name, as a Dataset does; "source" in the JSON says which). First one image's output is
checked to be float32 (3, 224, 224), then --warmup images run untimed, then the whole list is timed
in CPU seconds of the process (all its threads) and in wall seconds.

Prints one JSON object on stdout, nothing else (the libraries' own chatter goes to stderr):
{"mode", "images", "cpu_seconds", "wall_seconds", "source", "versions"}, or {"mode", "skipped"}
with the reason when the mode's library cannot be imported or set up here (exit status 0 both ways).
peers_venv.sh makes a venv with PyPI's wheels of every peer but torchvision (which is Debian's).
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy's import: one thread everywhere

import argparse
import importlib
import json
import math
import platform
import random
import re
import sys
import time
from importlib import metadata

SIZE = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
JITTER = 0.4  # brightness, contrast and saturation factors uniform in [1 - JITTER, 1 + JITTER]
DALI_BATCH = 32
MODES = ("torchvision", "opencv", "simplejpeg", "pyturbojpeg", "dali", "spdl")


class Skip(Exception):
    """The mode cannot run here; the message says why, on one line."""


def need(module):
    try:
        return importlib.import_module(module)
    except Exception as e:  # ImportError, or a library that fails as it loads
        raise Skip("cannot import %s: %s" % (module, one_line(e))) from e


def one_line(error, limit=400):
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def dist_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def loaded_library(stem):
    """The file name of the shared library named STEM that this process has mapped (or None)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(stem):
                return os.path.basename(os.path.realpath(path))
    return None


class Recipe:
    """torchvision's recipe written with cv2 and numpy, on an RGB uint8 HWC picture, into float32
    CHW. Its random draws come from Python's random, seeded, in torchvision's way."""

    def __init__(self, np, cv2, seed=0):
        self.np, self.cv2 = np, cv2
        self.rng = random.Random(seed)
        std = np.array(STD, np.float32)
        self.gain = 1.0 / (255.0 * std)  # ToTensor's 1/255 and Normalize's 1/std as one product
        self.bias = -np.array(MEAN, np.float32) / std

    def crop_box(self, height, width):
        """RandomResizedCrop.get_params: (top, left, height, width) of the crop."""
        area = height * width
        log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
        for _ in range(10):
            target = area * self.rng.uniform(*SCALE)
            aspect = math.exp(self.rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return self.rng.randint(0, height - h), self.rng.randint(0, width - w), h, w
        ratio = width / height  # ten misses: the whole picture, cut to the nearest allowed ratio
        if ratio < RATIO[0]:
            w, h = width, int(round(width / RATIO[0]))
        elif ratio > RATIO[1]:
            w, h = int(round(height * RATIO[1])), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def resized_crop(self, rgb):
        top, left, h, w = self.crop_box(*rgb.shape[:2])
        crop = rgb[top:top + h, left:left + w]  # a view: cv2 reads it with its row stride
        # cv2's default bilinear, as its users resize: not antialiased (torchvision's is), and the
        # cheaper for it (INTER_AREA, the antialiased one, costs 0.6-0.8 ms a crop here).
        return self.cv2.resize(crop, (SIZE, SIZE), interpolation=self.cv2.INTER_LINEAR)

    def finish(self, img):
        """Flip, ColorJitter, ToTensor and Normalize on a SIZE x SIZE RGB uint8 picture."""
        if self.rng.random() < 0.5:
            img = self.cv2.flip(img, 1)
        return self.normalize(self.jitter(img))

    def __call__(self, rgb):
        return self.finish(self.resized_crop(rgb))

    def jitter(self, img):
        """ColorJitter(0.4, 0.4, 0.4) as PIL's ImageEnhance blends, in a random order, each on
        uint8 with OpenCV's saturating SIMD arithmetic (the fastest way these libraries offer;
        rounded where PIL truncates)."""
        ops = [(op, self.rng.uniform(1 - JITTER, 1 + JITTER))
               for op in (self.brightness, self.contrast, self.saturation)]
        self.rng.shuffle(ops)
        for op, factor in ops:
            img = op(img, factor)
        return img

    def grey(self, img):  # PIL's convert("L") weights
        return self.cv2.cvtColor(img, self.cv2.COLOR_RGB2GRAY)

    def brightness(self, img, f):  # a blend with black
        return self.cv2.addWeighted(img, f, img, 0.0, 0.0)

    def contrast(self, img, f):  # a blend with the picture's mean grey
        mean = self.cv2.mean(self.grey(img))[0]
        return self.cv2.addWeighted(img, f, img, 0.0, (1 - f) * int(mean + 0.5))

    def saturation(self, img, f):  # a blend with each pixel's grey
        grey = self.cv2.cvtColor(self.grey(img), self.cv2.COLOR_GRAY2RGB)
        return self.cv2.addWeighted(img, f, grey, 1 - f, 0.0)

    def normalize(self, img):
        """ToTensor and Normalize into float32 CHW: a plane at a time (numpy is slow
        broadcasting over a last axis of 3)."""
        x = self.np.empty((3,) + img.shape[:2], self.np.float32)
        for c, plane in enumerate(self.cv2.split(img)):
            x[c] = plane
            x[c] *= self.gain[c]
            x[c] += self.bias[c]
        return x


class Peer:
    """A mode set up: ONE(item) makes one picture's output; RUN(items) makes them all; EXTRA goes
    into the JSON as it is."""

    def __init__(self, items, one, versions, source="memory", run=None, extra=None):
        self.items, self.one, self.versions, self.source = items, one, versions, source
        self.run = run or (lambda items: each(one, items))
        self.extra = extra or {}


def each(one, items):
    for item in items:
        one(item)


def cv_versions(np, cv2):
    return {"numpy": np.__version__, "opencv": cv2.__version__}


def cv_setup():
    np, cv2 = need("numpy"), need("cv2")
    cv2.setNumThreads(1)
    return np, cv2, Recipe(np, cv2)


def mode_torchvision(paths, _blobs):
    torch, torchvision, image = need("torch"), need("torchvision"), need("PIL.Image")
    T = need("torchvision.transforms")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    recipe = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(),
                        T.ColorJitter(JITTER, JITTER, JITTER), T.ToTensor(),
                        T.Normalize(MEAN, STD)])
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "pillow": dist_version("Pillow")}
    return Peer(paths, lambda path: recipe(image.open(path).convert("RGB")), versions, "files")


def mode_opencv(_paths, blobs):
    np, cv2, recipe = cv_setup()

    def one(blob):
        bgr = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
        return recipe(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return Peer(blobs, one, cv_versions(np, cv2))


def mode_simplejpeg(_paths, blobs):
    np, cv2, recipe = cv_setup()
    simplejpeg = need("simplejpeg")
    versions = dict(cv_versions(np, cv2), simplejpeg=simplejpeg.__version__)
    return Peer(blobs, lambda blob: recipe(simplejpeg.decode_jpeg(blob, colorspace="RGB")),
                versions)


def mode_pyturbojpeg(_paths, blobs):
    np, cv2, recipe = cv_setup()
    turbojpeg = need("turbojpeg")
    try:
        jpeg = turbojpeg.TurboJPEG()  # finds and loads libturbojpeg
    except Exception as e:
        raise Skip("PyTurboJPEG cannot use a libturbojpeg here: %s" % one_line(e)) from e
    versions = dict(cv_versions(np, cv2), PyTurboJPEG=dist_version("PyTurboJPEG"),
                    libturbojpeg=loaded_library("libturbojpeg"))
    return Peer(blobs, lambda blob: recipe(jpeg.decode(blob, pixel_format=turbojpeg.TJPF_RGB)),
                versions)


def dali_pipeline(dali, fn, types):
    """ImageNet's recipe as a DALI CPU pipeline that takes the JPEGs' bytes from feed_input."""
    factor = [1 - JITTER, 1 + JITTER]
    pipe = dali.Pipeline(batch_size=DALI_BATCH, num_threads=1, device_id=None, seed=0,
                          prefetch_queue_depth=1)  # one batch fed, one batch run
    with pipe:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(SCALE),
                                               random_aspect_ratio=list(RATIO))
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        images = fn.color_twist(images, brightness=fn.random.uniform(range=factor),
                                contrast=fn.random.uniform(range=factor),
                                saturation=fn.random.uniform(range=factor))
        pipe.set_outputs(fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[255 * m for m in MEAN], std=[255 * s for s in STD]))
    pipe.build()
    return pipe


def mode_dali(_paths, blobs):
    np, dali = need("numpy"), need("nvidia.dali")
    fn, types = need("nvidia.dali.fn"), need("nvidia.dali.types")
    try:
        pipe = dali_pipeline(dali, fn, types)
    except Exception as e:
        raise Skip("DALI cannot build a CPU-only pipeline here: %s" % one_line(e)) from e

    def batch(items):
        pipe.feed_input("jpegs", items)
        (out,) = pipe.run()
        return out

    def run(items):  # DALI_BATCH at a time, the last batch as short as what is left
        for start in range(0, len(items), DALI_BATCH):
            batch(items[start:start + DALI_BATCH])

    versions = {"nvidia-dali-cuda120": dali.__version__, "numpy": np.__version__,
                "nvimgcodec": dist_version("nvidia-nvimgcodec-cu12")}
    items = [np.frombuffer(blob, np.uint8) for blob in blobs]
    return Peer(items, lambda item: batch([item]).as_array()[0], versions, run=run,
                extra={"batch": DALI_BATCH})


def mode_spdl(_paths, blobs):
    np, cv2, recipe = cv_setup()
    spdl_io, utils = need("spdl.io"), need("spdl.io.utils")
    try:
        ffmpeg = utils.get_ffmpeg_versions()  # loads libspdl, linked to the system's FFmpeg
    except Exception as e:
        raise Skip("spdl %s loads the system's FFmpeg and its wheel ships none; on Debian 12 "
                   "libavdevice59 and libavfilter8 complete FFmpeg 5: %s"
                   % (dist_version("spdl"), ffmpeg_misses(e))) from e
    config = spdl_io.decode_config(decoder_options={"threads": "1"})

    def one(blob):
        packets = spdl_io.demux_image(blob)  # the header only: the picture's size
        top, left, h, w = recipe.crop_box(packets.height, packets.width)
        # FFmpeg crops in the JPEG's YUV, so an odd offset moves to the chroma grid's.
        graph = "crop=%d:%d:%d:%d,scale=%d:%d:flags=bilinear,format=rgb24" % (w, h, left, top,
                                                                              SIZE, SIZE)
        frames = spdl_io.decode_packets(packets, filter_desc=graph, decode_config=config)
        return recipe.finish(spdl_io.to_numpy(spdl_io.convert_frames(frames)))

    versions = dict(cv_versions(np, cv2), spdl=dist_version("spdl"),
                    libavcodec=".".join(map(str, ffmpeg.get("libavcodec", ()))))
    return Peer(blobs, one, versions)


def ffmpeg_misses(error):
    """spdl's long import error as "ffmpeg9 lacks libavutil.so.61, ...", or as it is."""
    misses = re.findall(r"_spdl_(ffmpeg\d+): (\S+): cannot open", str(error))
    if not misses:
        return one_line(error)
    return ", ".join("%s lacks %s" % miss for miss in misses)


def check_output(out):
    shape, dtype = tuple(out.shape), str(out.dtype).replace("torch.", "")
    assert (shape, dtype) == ((3, SIZE, SIZE), "float32"), "output %s %s" % (shape, dtype)


def timed(run, items):
    cpu, wall = time.process_time(), time.perf_counter()
    run(items)
    return time.process_time() - cpu, time.perf_counter() - wall


def bench(mode, paths, warmup):
    """The JSON result of MODE over the files at PATHS."""
    blobs = [] if mode == "torchvision" else [read(path) for path in paths]
    try:
        peer = globals()["mode_" + mode](paths, blobs)
        check_output(peer.one(peer.items[0]))
    except Skip as e:
        return {"mode": mode, "skipped": str(e)}
    except AssertionError:
        raise
    except Exception as e:  # set up, but the library failed on the first picture
        return {"mode": mode, "skipped": "first image failed: %s: %s" % (type(e).__name__,
                                                                       one_line(e))}
    peer.run([peer.items[k % len(peer.items)] for k in range(warmup)])
    cpu, wall = timed(peer.run, peer.items)
    images = len(peer.items)
    versions = dict(peer.versions, python=platform.python_version())
    return {"mode": mode, "images": images, "cpu_seconds": round(cpu, 4),
            "wall_seconds": round(wall, 4), "images_per_cpu_second": round(images / cpu, 1),
            "source": peer.source, "versions": versions, **peer.extra}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def stdout_for_json_only():
    """Sends all else bound for stdout (C libraries' too) to stderr; returns stdout's file."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return real


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--files", required=True, help="a file naming one JPEG a line")
    parser.add_argument("--warmup", type=int, default=20, help="images run untimed first")
    args = parser.parse_args()
    with open(args.files) as f:
        paths = [line.strip() for line in f if line.strip()]
    if not paths:
        parser.error("%s names no file" % args.files)
    out = stdout_for_json_only()
    result = bench(args.mode, paths, args.warmup)
    out.write(json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
