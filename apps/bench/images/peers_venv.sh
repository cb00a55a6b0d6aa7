#!/usr/bin/env bash
# bench_images' peers' venv: a plain venv (no system site-packages: the peers run as PyPI's wheels)
# of /usr/bin/python3 at DIR with the pinned versions below, for peers.py's modes other than
# torchvision (which runs on Debian's torch with /usr/bin/python3 itself).
#
#   apps/bench/images/peers_venv.sh DIR      prints DIR's python as its last line on stdout
#
# Each package installs on its own, so one that fails is named on stderr and the rest still come;
# peers.py then reports that mode skipped. A stamp in DIR holds the pins once all installed, so a
# second run does nothing. Notes on the pins:
#   PyTurboJPEG 1.x: 2.x wants libjpeg-turbo 3, and Debian 12's libturbojpeg0 is 2.1.
#   spdl loads the system's FFmpeg (4 to 9) at run time and its wheel ships none: on Debian 12 it
#   also needs libavdevice59 and libavfilter8 (Debian 12 here has only FFmpeg 5.1's libavcodec59,
#   libavformat59 and libavutil57); peers.py says so when they are missing.
set -euo pipefail

dir=${1:?usage: peers_venv.sh DIR}
pins=(
  numpy==2.4.6
  opencv-python-headless==5.1.0.95
  simplejpeg==1.9.0
  PyTurboJPEG==1.8.3
  nvidia-dali-cuda120==2.4.0
  spdl==0.8.0
)
stamp=$dir/peers-pins.txt
want=$(printf '%s\n' "${pins[@]}")

if [ ! -x "$dir/bin/python" ]; then
  /usr/bin/python3 -m venv "$dir" >&2
fi

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -f "$stamp"
  failed=0
  for pin in "${pins[@]}"; do
    if ! log=$("$dir/bin/pip" install --disable-pip-version-check -q "$pin" 2>&1); then
      why=$(printf '%s\n' "$log" | grep -m 1 '^ERROR' || printf '%s\n' "$log" | grep . | tail -n 1)
      echo "peers_venv: $pin not installed: ${why:-pip failed}" >&2
      failed=1
    fi
  done
  if [ "$failed" = 0 ]; then
    printf '%s\n' "$want" >"$stamp"
  fi
fi

echo "$dir/bin/python"
