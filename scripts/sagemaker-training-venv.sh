#!/usr/bin/env bash
# Makes VENV, a Python virtual environment with PyPI's sagemaker-training (pinned), for the test
# that compares how it and troupe read a SageMaker root (tests/deploy/sagemaker_training_check.py).
# With --torch, the venv of Debian's python3 that sees Debian's torch (--system-site-packages),
# numpy held below 2 as torch 1.13 needs: each instance's entry point of the job that AWS's images
# run (tests/deploy/toolkit_job_check.py). troupe never depends on it; the tests do, so the build
# installs it for them, as scripts/install-deps.sh installs Debian packages. Idempotent: a venv
# that imports it is kept.
#
# usage: scripts/sagemaker-training-venv.sh VENV [--torch]
set -euo pipefail

venv=${1:?usage: $0 VENV [--torch]}
version=5.1.4
python=python3
venv_args=()
pins=()
if [ "${2:-}" = --torch ]; then
  python=/usr/bin/python3
  venv_args=(--system-site-packages)
  pins=("numpy<2")
fi

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sagemaker_training" 2>/dev/null; then
  exit 0
fi
rm -rf "$venv"
if ! "$python" -m venv "${venv_args[@]}" "$venv"; then
  echo "sagemaker-training-venv: $python -m venv failed; install Debian's python3-venv" >&2
  exit 1
fi
echo "sagemaker-training-venv: installing sagemaker-training $version into $venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "sagemaker-training==$version" \
  "${pins[@]}"
"$venv/bin/python" -c "import sagemaker_training"
