"""CUDA test files without a GPU: each runs on cuda/ compiled for the host against the emulation of
the CUDA runtime in tests/cuda_emu, built as a shared library that the real fsdpcomp._C loads in
place of _fsdpcomp_cuda.so (FSDPCOMP_CUDA_LIB), in a pytest subprocess whose States send their CPU
tensors down the CUDA path (FSDPCOMP_TEST_EMULATED). The host glue (csrc/backend_cuda/fc_cuda_path.c,
state_cuda.c), the driver and the kernels all run; every test of the file must pass (a skip there
means the emulation was not picked up). The kernels' fp32 writes the device's NaN bits and
float-to-integer casts (tests/cuda_emu/emu_float.h). What only a GPU shows (timing, the memory
model, what emu_float.h says it cannot reproduce) is left to tests/gpu/run.sh."""
from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu"))
import pytest_emulated  # noqa: E402

if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
    pytest.skip("no C++ compiler for the CUDA emulation", allow_module_level=True)

# The CUDA test files that take the emulated library: the sparse, aggregate and stateful methods
# through the reduce-scatter, every method's single payloads (State.compress/decompress), and
# FSDP2's compressed parameter all-gathers, 8-bit residuals, dct's own cases with ef_decay's, and
# the units past the device's table of residual norms, the one-pass encodes' decisions over calls,
# what one call asks of the runtime (launches, memsets, events, waits: the emulated runtime's counts),
# PowerSGD's error feedback (ef_add, ef_keep), and adaptive's parts payloads (each span through its
# rung's kernels).
FILES = ["cuda/test_cuda_sparse.py", "cuda/test_cuda_single.py", "cuda/test_cuda_param_gather.py",
         "cuda/test_cuda_res8.py", "cuda/test_cuda_dct.py", "cuda/test_cuda_units.py",
         "cuda/test_cuda_onepass.py", "cuda/test_cuda_call_counts.py", "cuda/test_cuda_ef.py",
         "cuda/test_cuda_adaptive.py"]


# The emulator runs a kernel's threads as fibers on one core, and this process only waits: the
# selected files run side by side, one per core (at most 4), each test taking its file's result.
JOBS = max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture(scope="module")
def file_runs(request):
    selected = [item.callspec.params["test_file"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    lib = pytest_emulated.library()  # built once, before the files start
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        yield {f: pool.submit(pytest_emulated.run, f, lib) for f in dict.fromkeys(selected)}


@pytest.mark.parametrize("test_file", FILES)
def test_cuda_file_on_the_emulated_library(test_file, file_runs):
    file_runs[test_file].result()
