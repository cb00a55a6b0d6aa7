#!/usr/bin/env bash
# make image: builds the SageMaker image (deploy/sagemaker/Dockerfile) as $IMAGE
# (troupe-train:latest) with podman or docker (scripts/container-engine.sh picks one).
#
#   IMAGE_CUDA=on   (default) the CUDA stage is NVIDIA's image (CUDA_IMAGE, pulled if missing);
#                   the trainer gets its CUDA back end
#   IMAGE_CUDA=off  no CUDA stage: a CPU-only image, built from Debian images alone
#   IMAGE_TORCH=on  (default) the Dockerfile's last stage, pytorch: Python with torch, torchvision
#                   and troupe's package besides the C++ programs (torch from Debian in a CPU-only
#                   image, PyPI's CUDA wheels in a CUDA one; debian or pypi picks either)
#   IMAGE_TORCH=off the runtime stage alone: the C++ programs, no Python packages
#
# The Debian base images (debian:bookworm, debian:bookworm-slim) are used when the engine has
# them or can pull them. Where no image registry answers, one is made offline instead: a minimal
# Debian 12 (debootstrap --variant=minbase) from the Debian mirror apt is configured with here,
# imported as localhost/troupe-debian:bookworm and used for both.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-troupe-train:latest}
IMAGE_CUDA=${IMAGE_CUDA:-on}
IMAGE_TORCH=${IMAGE_TORCH:-on}
CUDA_VERSION=${CUDA_VERSION:-12.4.1}
CUDA_IMAGE=${CUDA_IMAGE:-nvidia/cuda:$CUDA_VERSION-devel-ubuntu22.04}
state=${IMAGE_STATE:-$PWD/build-image}
case "$IMAGE_CUDA" in on|off) ;; *)
  echo "make image: IMAGE_CUDA is '$IMAGE_CUDA'; use on (the CUDA image) or off (CPU only)" >&2
  exit 2 ;;
esac
case "$IMAGE_TORCH" in
  off) stage=(--target runtime) ;;
  on) stage=(--target pytorch --build-arg TORCH=auto) ;;
  debian|pypi) stage=(--target pytorch --build-arg "TORCH=$IMAGE_TORCH") ;;
  *) echo "make image: IMAGE_TORCH is '$IMAGE_TORCH'; use on (torch for the image's kind), debian," \
          "pypi or off (no Python packages)" >&2
     exit 2 ;;
esac

eval "$(scripts/container-engine.sh)"
[ -n "${CONTAINERS_CONF:-}" ] && export CONTAINERS_CONF

have() { $ENGINE image exists "$1" 2>/dev/null || $ENGINE image inspect "$1" >/dev/null 2>&1; }
pull() { timeout 120 $ENGINE pull -q "$1" >/dev/null 2>&1; }

# The Debian mirror apt uses here, for each suite of bookworm it knows (main component).
apt_sources() {
  apt-get update -qq >&2 || true
  apt-cache policy | awk '$3 ~ /^bookworm(-updates|-security)?\/main$/ {
      split($3, s, "/"); if (!seen[s[1]]++) print "deb " $2 " " s[1] " main" }'
}

offline_base() {
  local tag=localhost/troupe-debian:bookworm
  if have "$tag"; then echo "$tag"; return; fi
  command -v debootstrap >/dev/null 2>&1 || {
    echo "troupe: installing debootstrap from Debian" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
  }
  local sources mirror root
  sources=$(apt_sources)
  mirror=$(echo "$sources" | awk '$3 == "bookworm" {print $2; exit}')
  if [ -z "$mirror" ]; then
    echo "make image: no registry gave debian:bookworm and apt here has no bookworm mirror to make one from" >&2
    exit 1
  fi
  root="$state/debian-root"
  rm -rf "$root"
  echo "troupe: no registry gave debian:bookworm; making it offline: debootstrap --variant=minbase bookworm from $mirror" >&2
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$state/debootstrap.log" 2>&1 || {
    echo "make image: debootstrap failed; its log: $state/debootstrap.log" >&2
    tail -n 5 "$state/debootstrap.log" >&2
    exit 1
  }
  echo "$sources" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | $ENGINE import --change 'CMD ["bash"]' - "$tag" >/dev/null
  rm -rf "$root"
  echo "$tag"
}

base() {  # an image for $1, or the offline one
  if have "$1" || pull "$1"; then echo "$1"; else offline_base; fi
}
DEBIAN_IMAGE=${DEBIAN_IMAGE:-$(base debian:bookworm)}
DEBIAN_SLIM_IMAGE=${DEBIAN_SLIM_IMAGE:-$(base debian:bookworm-slim)}

if [ "$IMAGE_CUDA" = on ]; then
  if ! have "$CUDA_IMAGE" && ! pull "$CUDA_IMAGE"; then
    echo "make image: cannot get NVIDIA's CUDA image $CUDA_IMAGE (no registry answered);" \
         "IMAGE_CUDA=off builds a CPU-only image, or load that image into $ENGINE first" >&2
    exit 1
  fi
else
  CUDA_IMAGE=$DEBIAN_IMAGE
fi

echo "troupe: building $IMAGE with $ENGINE (IMAGE_CUDA=$IMAGE_CUDA IMAGE_TORCH=$IMAGE_TORCH; bases $DEBIAN_IMAGE, $DEBIAN_SLIM_IMAGE; CUDA stage $CUDA_IMAGE)"
start=$(date +%s)
# The build's RUN steps reach the Debian mirror through the host's network.
$ENGINE build --network host -f deploy/sagemaker/Dockerfile -t "$IMAGE" "${stage[@]}" \
  --build-arg "CUDA_IMAGE=$CUDA_IMAGE" --build-arg "CUDA_VERSION=$CUDA_VERSION" \
  --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" --build-arg "DEBIAN_SLIM_IMAGE=$DEBIAN_SLIM_IMAGE" .
echo "troupe: built $IMAGE in $(( $(date +%s) - start )) s: $($ENGINE image inspect --format '{{.Size}}' "$IMAGE") bytes"
