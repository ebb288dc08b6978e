"""The emulation of tests/cuda_emu computes fp32 as a GPU does where x86 differs and the bytes
show it (tests/cuda_emu/emu_float.h): a probe kernel (tests/cuda_emu/float_probe.cu) built as
build.py builds cuda/ writes the device's NaN (0x7fffffff) for every NaN an operation makes or
passes on, and the device's float-to-integer casts; built with the host's float
(FSDPCOMP_EMU_HOST_FLOAT=1) it writes x86's bits, which is how the H200's run 3 failed three
checks the emulation had passed. An emulator that went back to the host's float fails here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu")
sys.path.insert(0, HERE)
import build as emu_build  # noqa: E402

CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the CUDA emulation")


def run_probe(d, host_float: bool) -> dict[str, str]:
    old = os.environ.get("FSDPCOMP_EMU_HOST_FLOAT")
    os.environ["FSDPCOMP_EMU_HOST_FLOAT"] = "1" if host_float else "0"
    try:
        with open(os.path.join(HERE, "float_probe.cu")) as f:
            src = emu_build.rewrite(f.read())
        flags = emu_build.probe_flags()
    finally:
        if old is None:
            del os.environ["FSDPCOMP_EMU_HOST_FLOAT"]
        else:
            os.environ["FSDPCOMP_EMU_HOST_FLOAT"] = old
    name = "host" if host_float else "device"
    (d / f"{name}.cpp").write_text(src)
    exe = str(d / name)
    subprocess.run([CXX] + flags + [str(d / f"{name}.cpp"), os.path.join(HERE, "emu_swap.cpp"), "-o", exe],
                   check=True, capture_output=True, text=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines())


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    d = tmp_path_factory.mktemp("float_probe")
    return run_probe(d, host_float=False), run_probe(d, host_float=True)


def test_every_nan_an_operation_returns_is_the_devices(probes):
    device, host = probes
    assert device["made"] == "7fffffff 7fffffff" and host["made"] == "ffc00000 ffc00000"
    assert device["passed"] == "7fffffff" and host["passed"] == "7fc00000"
    assert device["neg"] == "7fffffff" and host["neg"] == "ffc00000"
    assert device["sqrt"] == "7fffffff" and host["sqrt"] == "ffc00000"
    assert device["from_double"] == "7fffffff" and host["from_double"] == "7fc00000"


def test_copies_and_finite_results_keep_their_bits(probes):
    device, host = probes
    assert device["kept"] == host["kept"] == "7fc00000 7fc00000"
    assert device["finite"] == host["finite"] == "3eaaaaab"


def test_float_to_integer_casts_are_the_devices(probes):
    device, host = probes
    assert device["cvt"] == "0 0 2147483647"  # cvt.rzi saturates, NaN to 0
    assert host["cvt"] == "0 -2147483648 -2147483648"  # x86's integer indefinite
