#!/usr/bin/env bash
# Packs bench_stream and troupe (and bench_stream_grpc, where it is built), stripped, with every
# shared library they load (the C library and its loader included), into one folder that runs on
# another x86-64 Linux machine without troupe's packages: how docs/benchmarks.md's 16-core figures
# ("Encrypted ingest") were taken.
#
#   apps/bench/stream/bundle.sh [BUILD_DIR] [FOLDER]      (defaults: build, /tmp/devrun)
#   copy FOLDER to the same path on the other machine, then there:
#   FOLDER/bench_stream --troupe FOLDER/troupe --grpc FOLDER/bench_stream_grpc \
#     --sizes 1048576 25690112 --modes raw_tcp raw_tls troupe_insecure troupe troupe_x2 grpc
#
# The binaries are patched (patchelf, Debian's package of that name) to load their libraries and
# loader from FOLDER, so FOLDER must be the same absolute path on both machines.
set -euo pipefail
build=${1:-build}
folder=${2:-/tmp/devrun}
command -v patchelf >/dev/null || { echo "bundle.sh: needs patchelf (apt-get install patchelf)" >&2; exit 2; }
for binary in "$build/apps/bench/stream/bench_stream" "$build/troupe"; do
  [ -x "$binary" ] || { echo "bundle.sh: $binary is not built (cmake --build $build --target bench_stream troupe)" >&2; exit 2; }
done
binaries=(bench_stream troupe)
rm -rf "$folder"
mkdir -p "$folder"
cp "$build/apps/bench/stream/bench_stream" "$build/troupe" "$folder/"
if [ -x "$build/apps/bench/stream/bench_stream_grpc" ]; then
  cp "$build/apps/bench/stream/bench_stream_grpc" "$folder/"
  binaries+=(bench_stream_grpc)
fi
for name in "${binaries[@]}"; do strip "$folder/$name"; done
for name in "${binaries[@]}"; do
  ldd "$folder/$name" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r library; do cp -L "$library" "$folder/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$folder/"
for name in "${binaries[@]}"; do
  binary="$folder/$name"
  # DT_RPATH, not RUNPATH: it holds for the libraries they load too (gRPC loads upb, absl).
  patchelf --set-interpreter "$folder/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$folder" "$binary"
done
echo "bundle.sh: $folder ($(du -sh "$folder" | cut -f1))"
