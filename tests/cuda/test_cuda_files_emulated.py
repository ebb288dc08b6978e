"""tests/cuda/test_cuda_single.py without a GPU: the single-payload codec (State.compress/decompress)
of the sparse, aggregate and stateful methods on cuda/ compiled for the host against the emulation
of the CUDA runtime in tests/cuda_emu, loaded by the real fsdpcomp._C in place of
_fsdpcomp_cuda.so (FSDPCOMP_CUDA_LIB), in a subprocess (as tests/cuda/test_cuda_files_emulated.py)."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu"))
import pytest_emulated  # noqa: E402

if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
    pytest.skip("no C++ compiler for the CUDA emulation", allow_module_level=True)


def test_single_payloads_on_the_emulated_cuda_library():
    pytest_emulated.run("cuda/test_cuda_single.py")
