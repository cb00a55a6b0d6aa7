#!/usr/bin/env bash
# Installs the Debian 12 packages troupe needs, only those that are missing. Idempotent.
# `--plots`: also what scripts/plot_scaling.py needs (`make scaling`), which the build never does.
# `--grpc`: also gRPC's C++ packages, for bench_stream's gRPC baseline (apps/bench/stream), which
# the build makes only where they are.
# `--no-python`: without the Python package's (the SageMaker image's build stage, which builds
# only the C++ programs).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  capnproto libcapnp-dev libuv1-dev libspdlog-dev catch2 libthrust-dev
  nlohmann-json3-dev libcli11-dev dataset-fashion-mnist libopencv-dev libopenblas-dev zlib1g-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
  libssl-dev openssl tcpdump procps iproute2 python3 python3-venv util-linux
  # scripts/bundle.sh and scripts/gpu-check.sh (a build packed to run on another machine).
  patchelf xz-utils
  # The Python package troupe.data (docs/pytorch.md) and its tests; the C++ build never needs them.
  python3-dev pybind11-dev python3-numpy python3-torch
  # tests/python/transforms_check.py and bench_images compare troupe's image pipeline with these.
  python3-torchvision python3-pil
)
if [ "${1:-}" = "--plots" ]; then
  packages=(python3 python3-matplotlib)
elif [ "${1:-}" = "--grpc" ]; then
  packages=(libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc)
elif [ "${1:-}" = "--no-python" ]; then
  kept=()
  for p in "${packages[@]}"; do
    case "$p" in
      python3-dev|pybind11-dev|python3-numpy|python3-torch|python3-torchvision|python3-pil) ;;
      *) kept+=("$p") ;;
    esac
  done
  packages=("${kept[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "troupe: installing missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=sudo
  else
    echo "troupe: these packages are missing and this user is not root: ${missing[*]}" >&2
    echo "troupe: install them as root: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
