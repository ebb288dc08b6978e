"""tests/test_cuda_single.py without a GPU: the single-payload codec (State.compress/decompress)
of the sparse, aggregate and stateful methods on cuda/ compiled for the host against the emulation
of the CUDA runtime in tests/cuda_emu, loaded by the real fsdpcomp._C in place of
_fsdpcomp_cuda.so (FSDPCOMP_CUDA_LIB), in a subprocess (as tests/test_cuda_sparse_emulated.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cuda_emu"))
import build as emu_build  # noqa: E402
from pkg_path import pythonpath  # noqa: E402

if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
    pytest.skip("no C++ compiler for the CUDA emulation", allow_module_level=True)


def test_single_payloads_on_the_emulated_cuda_library():
    out = os.environ.get("FSDPCOMP_EMU_DIR") or os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}")
    os.makedirs(out, exist_ok=True)
    lib = emu_build.build_shared(out)
    env = dict(os.environ, FSDPCOMP_CUDA_LIB=lib, FSDPCOMP_TEST_EMULATED="1",
               PYTHONPATH=os.pathsep.join([HERE, pythonpath()]))
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", os.path.join(HERE, "test_cuda_single.py"), "-q",
                        "-p", "no:cacheprovider", "-x"], capture_output=True, text=True, env=env, timeout=3000,
                       cwd=os.path.dirname(HERE))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
