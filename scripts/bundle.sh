#!/usr/bin/env bash
# Packs built binaries, stripped, with every shared library they load (the C library and its
# loader included), into one folder that runs on another x86-64 Linux machine without troupe's
# Debian packages: how the 16-core and GPU figures of docs/benchmarks.md were taken.
#
#   scripts/bundle.sh [--no-cuda-libs] FOLDER BINARY...
#
# FOLDER/bin holds the binaries, FOLDER/lib the libraries. The binaries are patched (patchelf,
# Debian's package of that name) to load their libraries and loader from FOLDER/lib (DT_RPATH, not
# RUNPATH: it holds for the libraries they load too), so FOLDER must be the same absolute path on
# both machines. --no-cuda-libs leaves out the GPU driver (libcuda, which must be the other
# machine's own) and cuBLAS (hundreds of MB; a GPU machine has its own), keeping CUDA's runtime
# (libcudart, under 1 MB, which every troupe binary loads): they are then found through
# LD_LIBRARY_PATH there (scripts/gpu-check.sh).
set -euo pipefail
cuda_libs=1
if [ "${1:-}" = "--no-cuda-libs" ]; then
  cuda_libs=0
  shift
fi
[ $# -ge 2 ] || { echo "usage: scripts/bundle.sh [--no-cuda-libs] FOLDER BINARY..." >&2; exit 2; }
folder=$1
shift
command -v patchelf >/dev/null || { echo "bundle.sh: needs patchelf (apt-get install patchelf)" >&2; exit 2; }
for binary in "$@"; do
  [ -x "$binary" ] || { echo "bundle.sh: $binary is not built" >&2; exit 2; }
done
rm -rf "$folder"
mkdir -p "$folder/bin" "$folder/lib"
for binary in "$@"; do
  cp "$binary" "$folder/bin/"
  strip "$folder/bin/$(basename "$binary")"
done
cuda='^lib(cuda\.|cublas|cublasLt|nvidia-|nvrtc|nvJitLink)'
for binary in "$@"; do
  ldd "$binary" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r library; do
  if [ $cuda_libs = 0 ] && [[ $(basename "$library") =~ $cuda ]]; then continue; fi
  cp -L "$library" "$folder/lib/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$folder/lib/"
folder=$(cd "$folder" && pwd)
for binary in "$folder"/bin/*; do
  patchelf --set-interpreter "$folder/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$folder/lib" "$binary"
done
echo "bundle.sh: $folder ($(du -sh "$folder" | cut -f1))"
