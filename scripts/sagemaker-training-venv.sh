#!/usr/bin/env bash
# Makes VENV, a Python virtual environment with PyPI's sagemaker-training (pinned), for the test
# that compares how it and troupe read a SageMaker root (tests/deploy/sagemaker_training_check.py).
# troupe never depends on it; the test does, so the build installs it for the test, as
# scripts/install-deps.sh installs Debian packages. Idempotent: a venv that imports it is kept.
#
# usage: scripts/sagemaker-training-venv.sh VENV
set -euo pipefail

venv=${1:?usage: $0 VENV}
version=5.1.4

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sagemaker_training" 2>/dev/null; then
  exit 0
fi
rm -rf "$venv"
if ! python3 -m venv "$venv"; then
  echo "sagemaker-training-venv: python3 -m venv failed; install Debian's python3-venv" >&2
  exit 1
fi
echo "sagemaker-training-venv: installing sagemaker-training $version into $venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "sagemaker-training==$version"
"$venv/bin/python" -c "import sagemaker_training"
