#!/usr/bin/env bash
# Makes VENV, a Python virtual environment of Debian's python3 with a current torch 2.x and
# torchvision from PyPI (what users run), for the conformance suite's whole matrix
# (`make conformance`: tests/conformance/run.py judges troupe.data under Debian's torch 1.13 and
# under this one). troupe's package is the build's (PYTHONPATH), built for Debian's Python, which
# this venv runs: numpy stays below 2 for the module's numpy API. Idempotent: a venv whose torch
# imports is kept. TORCH names another pin (default: the newest 2.x).
#
# usage: scripts/torch2-venv.sh VENV
set -euo pipefail

venv=${1:?usage: $0 VENV}
# The versions the conformance report was made with, and the SageMaker image's PyPI stage installs
# (deploy/sagemaker/Dockerfile's TORCH_PYPI): one pin, so what users get is what was judged.
torch=${TORCH:-torch==2.15.0}
torchvision=${TORCHVISION:-torchvision==0.29.2}

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, torchvision" 2>/dev/null; then
  exit 0
fi
rm -rf "$venv"
if ! /usr/bin/python3 -m venv "$venv"; then
  echo "torch2-venv: python3 -m venv failed; install Debian's python3-venv" >&2
  exit 1
fi
echo "torch2-venv: installing $torch, $torchvision and numpy<2 into $venv (about 3 GB with CUDA's libraries)"
"$venv/bin/pip" install --quiet --disable-pip-version-check "numpy<2" "$torch" "$torchvision"
"$venv/bin/python" -c "import torch, torchvision; print('torch2-venv: torch', torch.__version__, 'torchvision', torchvision.__version__)"
