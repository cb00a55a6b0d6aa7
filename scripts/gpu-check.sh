#!/usr/bin/env bash
# The dnn group on a real GPU (issue 40, docs/benchmarks.md "The dnn group on a GPU"): one prepared
# run on a GPU machine that has CUDA's driver and libraries and a python3, but none of troupe's
# Debian packages and no network.
#
#   scripts/gpu-check.sh prepare [--build DIR] [--root R] [--no-tarball]
#       here, on Debian 12: builds what the check runs (with nvcc: CUDA for sm_75 and sm_90),
#       packs it with its libraries and Fashion-MNIST into R (default /tmp/troupe-gpu), and R into
#       .gpu/troupe-gpu.tar.xz, the one file to carry to the GPU machine with the working tree
#       (--no-tarball: R alone, to run here).
#   scripts/gpu-check.sh run OUT [--root R] [--device cuda|cpu] [--quick] [gpu_check.py flags]
#       there, in the repository's root: unpacks .gpu/troupe-gpu.tar.xz into R (the same absolute
#       path: the binaries load their libraries from it) and runs scripts/gpu_check.py, which
#       writes OUT/gpu-check.txt (the table), OUT/gpu-check.json and OUT/logs.tar.gz; exits 1 when
#       a check failed. --device cpu runs the same path without a GPU (a GPU check then reports
#       itself skipped); --quick makes the runs small (the test of the script, tests/CMakeLists).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tarball=$here/.gpu/troupe-gpu.tar.xz
root=/tmp/troupe-gpu
build=$here/build
binaries=(troupe apps/hetero_train/hetero_train tests/actors/actors_tests
          apps/bench/compare/bench_compare apps/bench/pipeline/bench_pipeline)

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

prepare() {
  while [ $# -gt 0 ]; do
    case $1 in
      --build) build=$(cd "$2" && pwd); shift 2 ;;
      --root) root=$2; shift 2 ;;
      --no-tarball) no_tarball=1; shift ;;
      *) echo "gpu-check.sh prepare: unknown argument '$1'" >&2; usage ;;
    esac
  done
  [ -f "$build/build.ninja" ] || { echo "gpu-check.sh: $build is not configured (make build)" >&2; exit 2; }
  command -v patchelf >/dev/null || { echo "gpu-check.sh: needs patchelf (scripts/install-deps.sh installs it)" >&2; exit 2; }
  # A build configured here, where no GPU is, has no CUDA code (TROUPE_CUDA=AUTO): ask for it.
  if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } &&
     ! grep -q '^TROUPE_CUDA:STRING=ON' "$build/CMakeCache.txt"; then
    echo "gpu-check.sh: configuring $build with -DTROUPE_CUDA=ON (the check is for a GPU)" >&2
    cmake -DTROUPE_CUDA=ON -B "$build" >/dev/null
  fi
  cmake --build "$build" --target troupe hetero_train actors_tests bench_compare bench_pipeline
  if ! ldd "$build/tests/actors/actors_tests" | grep -q libcublas; then
    echo "gpu-check.sh: $build has no CUDA code (nvcc not found): its trainer cannot use a GPU" >&2
    echo "  the bundle is still made, for the CPU path (run ... --device cpu)" >&2
  elif command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
    objdump_cmd=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    if ! "$objdump_cmd" --list-elf "$build/tests/actors/actors_tests" | grep -q sm_90; then
      echo "gpu-check.sh: $build has no sm_90 code (CMAKE_CUDA_ARCHITECTURES); an H100/H200 would JIT the PTX" >&2
      exit 2
    fi
  fi
  local paths=()
  for b in "${binaries[@]}"; do paths+=("$build/$b"); done
  "$here/scripts/bundle.sh" --no-cuda-libs "$root" "${paths[@]}"
  if [ -f "$build/compile_commands.json" ] && ls "$build"/python/troupe/_native*.so >/dev/null 2>&1; then
    python3 "$here/scripts/gpu_pykit.py" "$build" "$root/pykit" "$root/lib"
  else
    echo "gpu-check.sh: $build has no Python module: the bundle has no pykit (the pytorch check skips)" >&2
  fi
  mkdir -p "$root/data/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/*.gz "$root/data/fashion-mnist/"
  git -C "$here" rev-parse HEAD > "$root/commit" 2>/dev/null || echo unknown > "$root/commit"
  if [ -n "${no_tarball:-}" ]; then
    echo "gpu-check.sh: $root ($(du -sh "$root" | cut -f1)); scripts/gpu-check.sh run OUT --root $root"
    return
  fi
  mkdir -p "$here/.gpu"
  tar -C "$root" -cf - . | xz -T2 -6 > "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
  echo "gpu-check.sh: $tarball ($(du -h "$tarball" | cut -f1)) from $(cat "$root/commit"); there:"
  echo "  scripts/gpu-check.sh run \$OUT      (carry .gpu; the root there must be $root)"
}

run() {
  [ $# -ge 1 ] || usage
  local out=$1
  shift
  local rest=()
  while [ $# -gt 0 ]; do
    case $1 in
      --root) root=$2; shift 2 ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  if [ -f "$tarball" ]; then
    # Unpacked afresh unless this very tarball is what the root holds (the machine that made it).
    stamp=$(stat -c '%s %Y' "$tarball")
    if [ "$(cat "$root/.unpacked-from" 2>/dev/null)" != "$stamp" ]; then
      if [ -d "$root" ] && [ ! -f "$root/.unpacked-from" ] && [ -x "$root/bin/troupe" ]; then
        : # the folder prepare made: the same files as the tarball
      else
        rm -rf "$root"
        mkdir -p "$root"
        xz -dc "$tarball" | tar -C "$root" -xf -
      fi
      echo "$stamp" > "$root/.unpacked-from"
    fi
  fi
  [ -x "$root/bin/troupe" ] || { echo "gpu-check.sh: no bundle in $root and no $tarball: run 'scripts/gpu-check.sh prepare' on the build machine" >&2; exit 2; }
  echo "gpu-check.sh: bundle of $(cat "$root/commit" 2>/dev/null || echo '?') in $root"
  exec python3 "$here/scripts/gpu_check.py" --root "$root" --out "$out" ${rest[@]+"${rest[@]}"}
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
