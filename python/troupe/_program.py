"""The `troupe` command of an installed wheel (console script): execs the troupe program the wheel
carries, troupe/_bin/troupe, so `troupe sim ... -- python train.py` works from a venv."""

import os
import sys


def path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "troupe")


def main():
    program = path()
    if not os.access(program, os.X_OK):
        sys.exit("troupe: this install of the troupe package carries no troupe program (%s): the "
                 "wheel (`make wheel`) has it; from a source build run <build>/troupe" % program)
    os.execv(program, [program] + sys.argv[1:])
