"""Runs one CUDA test file of tests/ without a GPU: the emulated CUDA library (build.py's
build_shared) loaded by the real fsdpcomp._C in place of _fsdpcomp_cuda.so (FSDPCOMP_CUDA_LIB),
in a pytest subprocess whose States send their CPU tensors down the CUDA path
(FSDPCOMP_TEST_EMULATED). tests/cuda/test_cuda_files_emulated.py calls it, one test per file."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import build as emu_build
from helpers.pkg_path import pythonpath

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library() -> str:
    """The emulated library, built once per source state (FSDPCOMP_EMU_DIR, or a folder in /tmp)."""
    out = os.environ.get("FSDPCOMP_EMU_DIR") or os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}")
    os.makedirs(out, exist_ok=True)
    return emu_build.build_shared(out)


def run(test_file: str, lib: str | None = None) -> None:
    """Runs tests/<test_file> on the emulated library (`lib`, or library()); fails the caller unless
    every test in it ran and passed (a skip there means the emulation was not picked up)."""
    lib = lib or library()
    # the fsdpcomp this run imported (installed, or the checkout built in place), never the bare
    # checkout: on a fresh clone that has no _C and would shadow the install
    env = dict(os.environ, FSDPCOMP_CUDA_LIB=lib, FSDPCOMP_TEST_EMULATED="1",
               PYTHONPATH=os.pathsep.join([TESTS, pythonpath()]))
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", os.path.join(TESTS, test_file), "-q",
                        "-p", "no:cacheprovider", "-x"], capture_output=True, text=True, env=env, timeout=3000,
                       cwd=os.path.dirname(TESTS))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
