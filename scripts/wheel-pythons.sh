#!/usr/bin/env bash
# The Pythons troupe's wheels are built for and tested with (scripts/wheel.sh, make test-wheel):
# Debian's /usr/bin/python3, then python3.10, python3.12 and python3.13 where found, one path
# each on a line: the interpreter itself (a pyenv shim names one only where that version is
# selected; pyenv's versions folder is looked in too).
set -uo pipefail
echo /usr/bin/python3
for v in 3.10 3.12 3.13; do
  exe=$("python$v" -c 'import sys; print(sys.executable)' 2>/dev/null) ||
    exe=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$v.*/bin/python$v 2>/dev/null | tail -n 1)
  [ -n "$exe" ] && echo "$exe"
done
exit 0
