#!/usr/bin/env bash
# make test-wheel: the wheel `make wheel` wrote to dist/, installed as a user installs it and run
# as docs/pytorch.md has them run it - no build tree, no PYTHONPATH, no troupe in PATH but the
# venv's.
#
#   1. a fresh venv that sees the system's packages (Debian's torch and torchvision: the module
#      does not link torch), in a folder of its own; `pip install` of the wheel, offline. With
#      TORCH_FROM=pypi, a venv of PYTHON's own with PyPI's torch and torchvision (the versions
#      scripts/torch2-venv.sh pins, and numpy as they pull it) installed first: the way to test
#      the wheel of a Python that has no Debian torch (3.10, 3.12, 3.13);
#   2. every shared library the installed module and program load is the wheel's own
#      (troupe.libs/) or one of the few every manylinux platform has and a slim image holds
#      (glibc's, libstdc++, libgcc_s, zlib): read with ldd, so a library the wheel forgot fails
#      here rather than on a user's image;
#   3. the drop-in example (examples/pytorch/train_images.py, copied out of the tree) on an
#      ImageFolder made here from Fashion-MNIST (JPEGs and PNGs), under the wheel's own
#      `troupe sim` with two data instances and one dnn instance: every instance exits 0 and the
#      script trains every sample of its epoch;
#   4. troupe.data.ImageDataset (troupe's C++ decoding: libjpeg-turbo, libpng) reads both kinds
#      of file with the same pixels as PIL where the decode is exact (PNG), and a CMYK JPEG as
#      PIL makes it RGB;
#   5. a script written for SageMaker's script mode (tests/python/script_mode/, shipped as
#      sourcedir.tar.gz with a requirements.txt) through the wheel's troupe-sagemaker-train, as a
#      user's own image runs it, under the wheel's `troupe sim`: every instance exits 0 and the
#      script trains every sample of each epoch once;
#   6. the same kind of script as AWS's own PyTorch images run it: PyPI's sagemaker-training
#      toolkit as every instance's entry point, the wheel named by requirements.txt, a data
#      instance's process killed inside training (Debian's torch only).
#
# Prints one line per check, PASS or FAIL with why; exit 0 when every one passed, 77 (a skip,
# with its reason) without torch.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-/usr/bin/python3}
torch_from=${TORCH_FROM:-system}
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=${1:-$(ls "$repo"/dist/troupe-*-"$tag"-*.whl 2>/dev/null | head -n 1)}
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "FAIL: no wheel in $repo/dist (make wheel writes it)"
  exit 1
fi
if [ "$torch_from" = system ] && ! "$python" -c "import torch, torchvision" 2>/dev/null; then
  echo "SKIP: wheel test: $python has no torch and torchvision (apt-get install python3-torch python3-torchvision)"
  exit 77
fi
work=$(mktemp -d /tmp/troupe-wheel-test.XXXXXX)
sim=
cleanup() {
  [ -n "$sim" ] && kill -TERM "$sim" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }
# sim_job FILE ARGS...: `troupe sim` on two data instances and one dnn instance with ARGS, its
# output into FILE and the variable log, its exit status in code (reaped here; killed at exit).
sim_job() {
  local file=$1
  shift
  troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge "$@" \
    > "$file" 2>&1 &
  sim=$!
  wait "$sim"
  code=$?
  sim=
  log=$(cat "$file")
}

if [ "$torch_from" = pypi ]; then
  torch_pins=$(sed -n 's/^torch=\${TORCH:-\(.*\)}$/\1/p; s/^torchvision=\${TORCHVISION:-\(.*\)}$/\1/p' "$repo/scripts/torch2-venv.sh")
  "$python" -m venv "$work/venv"
  started=$SECONDS
  if ! out=$("$work/venv/bin/pip" install -q --disable-pip-version-check $torch_pins 2>&1); then
    # The pinned torch has no wheel for this Python (torch 2.15 dropped 3.10): the newest pair
    # that has, as pip picks it.
    if grep -q "No matching distribution found for torch" <<<"$out"; then
      echo "wheel test: PyPI has no $(echo $torch_pins) for $("$python" --version); the newest torch and torchvision that it has for it"
      torch_pins="torch torchvision"
      out=$("$work/venv/bin/pip" install -q --disable-pip-version-check $torch_pins 2>&1) || {
        fail "install: PyPI's torch and torchvision for $("$python" --version): $(tail -n 3 <<<"$out")"
        exit 1
      }
    else
      fail "install: PyPI's $(echo $torch_pins) for $("$python" --version): $(tail -n 3 <<<"$out")"
      exit 1
    fi
  fi
  echo "wheel test: PyPI's $(echo $torch_pins) into a fresh venv of $python ($((SECONDS - started)) s)"
else
  "$python" -m venv --system-site-packages "$work/venv"
fi
echo "wheel test: $(basename "$wheel"); $("$python" --version), glibc $(ldd --version | head -n 1 | awk '{print $NF}'), torch $("$work/venv/bin/python" -c 'import torch; print(torch.__version__)'), numpy $("$work/venv/bin/python" -c 'import numpy; print(numpy.__version__)')"
cd "$work"
export PATH="$work/venv/bin:/usr/bin:/bin"
unset PYTHONPATH LD_LIBRARY_PATH
if out=$(pip install -q --no-index --disable-pip-version-check "$wheel" 2>&1); then
  pass "install: pip install $(basename "$wheel") into a fresh venv, offline"
else
  fail "install: $out"
  exit 1
fi

# 2. The libraries: the wheel's or the platform's, nothing from this machine's other packages.
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
native=$(ls "$site"/troupe/_native*.so)
program=$site/troupe/_bin/troupe
bad=$(ldd "$native" "$program" | awk '/=>/ {print $1, $3}' | while read -r name path; do
  case "$(realpath -m "$path")" in
    "$site"/troupe.libs/*) ;;
    *) case "$name" in
         libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libstdc++.so.*|libgcc_s.so.*|libz.so.1|ld-linux*) ;;
         *) echo "$name ($path)" ;;
       esac ;;
  esac
done)
if [ -z "$bad" ] && ! ldd "$native" "$program" | grep -q "not found"; then
  pass "libraries: the module and the program load only the wheel's ($(ls "$site/troupe.libs" | wc -l) in troupe.libs) and glibc's, libstdc++, libgcc_s, zlib"
else
  fail "libraries from outside the wheel: $(echo $bad) $(ldd "$native" "$program" | grep 'not found')"
fi
where=$(command -v troupe)
package=$(python -c 'import troupe.data; print(troupe.__file__)')
if [ "$where" = "$work/venv/bin/troupe" ] && troupe --help >/dev/null 2>&1 &&
   [ "$package" = "$site/troupe/__init__.py" ]; then
  pass "program and package: the wheel's ($where, $package)"
else
  fail "program and package: troupe is '$where' and the package '$package', not the venv's ($site), or --help failed"
fi

# 3. The drop-in example on an ImageFolder made here: 10 classes, 40 training images each (every
# fourth a PNG) and 10 test images each, Fashion-MNIST's pictures tinted and enlarged to 40x40.
python - "$work/data" <<'EOF'
import gzip, os, sys
import numpy as np
from PIL import Image
root = sys.argv[1]
with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)
count = {}
for i in range(len(images)):
    c = int(labels[i])
    n = count.get(c, 0)
    if n == 50:
        continue
    count[c] = n + 1
    split = "train" if n < 40 else "test"
    rgb = np.stack([images[i], images[i] // 2 + 60, 255 - images[i]], axis=2)
    picture = Image.fromarray(rgb).resize((40, 40), Image.BILINEAR)
    folder = os.path.join(root, split, "class_%d" % c)
    os.makedirs(folder, exist_ok=True)
    picture.save(os.path.join(folder, "%05d.%s" % (i, "png" if n % 4 == 3 else "jpg")), quality=90)
    if len(count) == 10 and all(v == 50 for v in count.values()):
        break
EOF
cp "$repo/examples/pytorch/train_images.py" "$work/"
sim_job "$work/sim.log" -- python train_images.py "$work/data" --epochs 2 --batch-size 32
if [ "$code" = 0 ] && grep -q "epoch 2/2: 400 samples" <<<"$log" &&
   grep -q "troupe sim: all 3 instances exited 0" <<<"$log"; then
  pass "example: train_images.py under the wheel's troupe sim, 2 data + 1 dnn instance: $(grep -o 'epoch 2/2: [^,]*, [^,]*' <<<"$log"), all 3 instances exited 0"
else
  fail "example: troupe sim exited $code; its log ends: $(tail -n 15 <<<"$log")"
fi

# 4. troupe's own decoding from the wheel (no OpenCV imgcodecs in it): a PNG's pixels are PIL's.
if out=$(python - "$work/data/train" 2>&1 <<'EOF'
import sys
import numpy as np
from PIL import Image
import troupe.data
ds = troupe.data.ImageDataset(sys.argv[1], "CenterCrop(40)")  # the whole 40x40 picture
kinds = {}
for i in range(len(ds)):
    kinds.setdefault(ds.source.name(i).rsplit(".", 1)[1], i)
for kind, i in sorted(kinds.items()):
    x, _ = ds[i]
    got = x.numpy()
    if got.dtype != np.uint8:
        got = np.rint(got * 255)
    got = got.astype(int).transpose(1, 2, 0) if got.shape[0] == 3 else got.astype(int)
    want = np.asarray(Image.open(ds.source.name(i) if ds.source.name(i).startswith("/")
                                 else sys.argv[1] + "/" + ds.source.name(i)).convert("RGB"))
    diff = int(np.abs(got - want).max())
    print("%s (%s) %s, max difference from PIL %d;" % (ds.source.name(i), kind, got.shape, diff))
    if kind == "png" and diff != 0:
        sys.exit("the PNG %s differs from PIL's by %d" % (ds.source.name(i), diff))
# A CMYK JPEG (ImageNet has some): the wheel has no OpenCV codecs, troupe's own decode makes it
# RGB as PIL does, exactly.
import io
buf = io.BytesIO()
Image.fromarray(np.uint8(np.arange(40 * 30 * 3).reshape(30, 40, 3) % 251)).convert("CMYK").save(
    buf, format="JPEG", quality=90)
from troupe import _native
got = _native.Transform("CenterCrop((30, 40))")(buf.getvalue(), 0, "cmyk.jpg")
diff = int(np.abs(np.asarray(got).astype(int) -
                  np.asarray(Image.open(buf).convert("RGB")).astype(int)).max())
print("a CMYK JPEG, max difference from PIL %d;" % diff)
if diff != 0:
    sys.exit("the CMYK JPEG differs from PIL's by %d" % diff)
EOF
); then
  pass "decode: troupe's C++ decoding from the wheel: $(echo $out)"
else
  fail "decode: $out"
fi

# 5. Script mode from the wheel: its own entry point (the console script troupe-sagemaker-train,
# nothing copied out of the tree), the source as the SDK ships it, pip offline (numpy is met by
# Debian's, through the venv's system site packages).
mkdir -p "$work/source" "$work/channel"
cp "$repo/tests/python/script_mode/train.py" "$work/source/"
echo numpy > "$work/source/requirements.txt"
tar -C "$work/source" -czf "$work/sourcedir.tar.gz" .
python -c 'import sys; sys.stdout.writelines("%g,%g\n" % (i / 100, 3 * i / 100 + 1) for i in range(200))' \
  > "$work/channel/rows.csv"
PIP_NO_INDEX=1 sim_job "$work/script-mode.log" --channel train="$work/channel" \
  --hp sagemaker_program=train.py --hp sagemaker_submit_directory="file://$work/sourcedir.tar.gz" \
  --hp epochs=2 --hp batch-size=20 -- "$work/venv/bin/troupe-sagemaker-train"
if [ "$code" = 0 ] && grep -q "script-mode epoch 1: 200 samples, 200 distinct of 200" <<<"$log" &&
   [ "$(grep -c "requirements.txt installed" <<<"$log")" = 3 ] &&
   grep -q "troupe sim: all 3 instances exited 0" <<<"$log"; then
  pass "script mode: a SageMaker script through train under the wheel's troupe sim: $(grep -o 'script-mode epoch 1: [^,]*, [^,]*' <<<"$log"), requirements installed on all 3, all 3 instances exited 0"
else
  fail "script mode: troupe sim exited $code; its log ends: $(tail -n 15 <<<"$log")"
fi
# 6. AWS's own images' way: PyPI's sagemaker-training toolkit as every instance's entry point, the
# wheel named by the source's requirements.txt (the toolkit pip-installs it on each instance), a
# data instance's process SIGKILLed inside training (tests/deploy/toolkit_job_check.py). A venv
# per instance, as each SageMaker instance has its own container; Debian's torch in each.
if [ "$torch_from" != system ]; then
  echo "SKIP toolkit: with Debian's torch only (TORCH_FROM=system): three more venvs of PyPI's torch"
elif [ "$(id -u)" != 0 ]; then
  echo "SKIP toolkit: troupe sim --netns needs root (each instance's host name must resolve)"
else
  for host in algo-1 algo-2 algo-3; do
    if ! out=$("$repo/scripts/sagemaker-training-venv.sh" "$work/toolkit/$host" --torch 2>&1); then
      fail "toolkit: a venv with sagemaker-training for $host: $(tail -n 3 <<<"$out")"
    fi
  done
  if out=$(/usr/bin/python3 "$repo/tests/deploy/toolkit_job_check.py" --troupe "$work/venv/bin/troupe" \
             --venv "$work/toolkit" --venv-per-host --wheel "$wheel" --kill 2>&1); then
    pass "toolkit: sagemaker-training's train on every instance: $(tail -n 1 <<<"$out" | sed 's/^toolkit_job_check: //')"
  else
    fail "toolkit: $(grep -m1 FAILED <<<"$out"); its output ends: $(tail -n 15 <<<"$out")"
  fi
fi
exit $failed
