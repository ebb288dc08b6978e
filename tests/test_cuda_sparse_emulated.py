"""tests/test_cuda_sparse.py without a GPU: cuda/ compiled for the host against the emulation of
the CUDA runtime in tests/cuda_emu, built as a shared library that the real fsdpcomp._C loads in
place of _fsdpcomp_cuda.so (FSDPCOMP_CUDA_LIB), in a subprocess; that file's States send their CPU
tensors down the CUDA path (State._emulate_cuda). The host glue (csrc/fc_cuda_path.c,
state_cuda.c), the driver and the kernels all run; what only a GPU shows (timing, the memory
model, the hardware's own NaN bits) is left to tests/gpu/run.sh."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_emu"))
import pytest_emulated  # noqa: E402

if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
    pytest.skip("no C++ compiler for the CUDA emulation", allow_module_level=True)


def test_sparse_methods_on_the_emulated_cuda_library():
    pytest_emulated.run("cuda/test_cuda_sparse.py")
