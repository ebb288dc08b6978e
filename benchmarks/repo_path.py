"""Which fsdpcomp the benchmarks import: the checkout's when it was built in place there
(`python setup.py build_ext --inplace`), else the installed package (`pip install .`), so a
source tree without its extension never shadows a working install."""
import glob
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def built_in_place(repo: str = REPO) -> bool:
    return bool(glob.glob(os.path.join(repo, "fsdpcomp", "_C*.so")))


def python_path(repo: str = REPO) -> list[str]:
    """The entries to put in front of sys.path / PYTHONPATH for this checkout."""
    return [repo] if built_in_place(repo) else []


def use_checkout() -> None:
    for p in python_path():
        if p not in sys.path:
            sys.path.insert(0, p)
