"""fsdpcomp._C is built on CPython's stable ABI (Py_LIMITED_API 3.10, setup.py): its file is
_C.abi3.so, and the very same file loads and works in every other CPython >= 3.10 found here,
which is what lets one cp310-abi3 wheel serve them all."""
import os
import subprocess
import sys

import pytest

import fsdpcomp
from helpers.pythons import ABI3_PROBE, other_cpythons


def test_extension_is_abi3():
    name = os.path.basename(fsdpcomp._C.__file__)
    assert name == "_C.abi3.so", f"{fsdpcomp._C.__file__} is not a stable-ABI build (setup.py: py_limited_api)"


def test_same_file_loads_in_other_cpythons():
    pythons = other_cpythons()
    if not pythons:
        pytest.skip("no other CPython >= 3.10 on this machine")
    mine = subprocess.run([sys.executable, "-c", ABI3_PROBE, fsdpcomp._C.__file__], capture_output=True, text=True,
                          timeout=120)
    assert mine.returncode == 0, mine.stderr
    expect = mine.stdout.split()[1:]
    for minor, exe in sorted(pythons.items()):
        r = subprocess.run([exe, "-c", ABI3_PROBE, fsdpcomp._C.__file__], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{exe} ({minor}): {r.stderr[-2000:]}"
        assert r.stdout.split() == ["%d.%d" % minor] + expect, (exe, r.stdout)
