#!/usr/bin/env bash
# bench_stream and troupe (and bench_stream_grpc, where it is built) packed by scripts/bundle.sh
# into a folder that runs on another x86-64 Linux machine without troupe's packages: how
# docs/benchmarks.md's 16-core figures ("Encrypted ingest") were taken.
#
#   apps/bench/stream/bundle.sh [BUILD_DIR] [FOLDER]      (defaults: build, /tmp/devrun)
#   copy FOLDER to the same path on the other machine, then there:
#   FOLDER/bin/bench_stream --troupe FOLDER/bin/troupe --grpc FOLDER/bin/bench_stream_grpc \
#     --sizes 1048576 25690112 --modes raw_tcp raw_tls troupe_insecure troupe troupe_x2 grpc
set -euo pipefail
build=${1:-build}
folder=${2:-/tmp/devrun}
binaries=("$build/apps/bench/stream/bench_stream" "$build/troupe")
if [ -x "$build/apps/bench/stream/bench_stream_grpc" ]; then
  binaries+=("$build/apps/bench/stream/bench_stream_grpc")
fi
exec "$(dirname "$0")/../../../scripts/bundle.sh" "$folder" "${binaries[@]}"
