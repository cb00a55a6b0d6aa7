#!/usr/bin/env bash
# Picks a container engine for `make image` and `make test-image` and prints it as shell
# assignments (ENGINE=..., CONTAINERS_CONF=...) for the caller to eval:
#   - docker, when a Docker engine answers (`docker info`; the client alone is not enough);
#   - else podman, installed from Debian when missing (root: apt-get; otherwise it says what to
#     install). podman gets troupe's own configuration file, never the system's, made for this
#     machine: the OCI runtime runc where the cgroups are a v1/v2 hybrid (crun refuses it), and
#     default rlimits within this process's hard limits (podman's defaults ask for more, which
#     an unprivileged sandbox refuses).
# Exits 3 with one line on stderr when no engine can run a container here.
set -euo pipefail
state=${IMAGE_STATE:-$(cd "$(dirname "$0")/.." && pwd)/build-image}
mkdir -p "$state"

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "ENGINE=docker"
  exit 0
fi
if ! command -v podman >/dev/null 2>&1; then
  need=(podman runc netavark aardvark-dns containernetworking-plugins conmon)
  if [ "$(id -u)" -ne 0 ]; then
    echo "no container engine: no Docker engine answers and podman is missing; as root: apt-get install -y ${need[*]}" >&2
    exit 3
  fi
  echo "troupe: installing podman from Debian: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >&2 || {
    echo "no container engine: installing podman failed" >&2
    exit 3
  }
fi
# rlimits: each at most this process's hard limit. nproc further capped: raising RLIMIT_NPROC
# past a sandbox's own cap fails with EPERM even below the hard limit (seen here at 65536).
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
runtime=
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] && command -v runc >/dev/null 2>&1; then
  runtime='runtime = "runc"'
fi
conf="$state/containers.conf"
cat > "$conf" <<CONF
# Made by scripts/container-engine.sh for this machine; read by podman through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
$runtime
CONF
if ! CONTAINERS_CONF=$conf podman info >/dev/null 2>&1; then
  echo "no container engine: podman is installed but 'podman info' fails: $(CONTAINERS_CONF=$conf podman info 2>&1 | tail -n 1)" >&2
  exit 3
fi
echo "ENGINE=podman"
echo "CONTAINERS_CONF=$conf"
