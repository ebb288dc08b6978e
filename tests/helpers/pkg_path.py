"""Where the fsdpcomp these tests imported lives, so the subprocesses they start (torchrun,
benchmarks, notebooks) import the same one: the checkout when built in place, else the
installed package. Putting the checkout itself on PYTHONPATH would shadow an install with a
source tree that has no compiled extension."""
import os

import fsdpcomp

PKG_DIR = os.path.dirname(os.path.abspath(fsdpcomp.__file__))  # .../fsdpcomp
PKG_ROOT = os.path.dirname(PKG_DIR)  # the sys.path entry that holds it


def pythonpath() -> str:
    """PYTHONPATH for a child process: this fsdpcomp first, then whatever was there."""
    return os.pathsep.join(p for p in (PKG_ROOT, os.environ.get("PYTHONPATH", "")) if p)
