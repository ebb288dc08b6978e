"""Whether this fsdpcomp can take CUDA tensors on this machine, asked before the first one (at
``register`` when the model's parameters are on CUDA, else at the first CommState call with a
CUDA tensor): a build without the CUDA library, or an NVIDIA driver older than the CUDA the
library was built with, is named with what to do, instead of a loader error or cudart's
"driver version is insufficient" from inside the first hook call.

The test seam: FSDPCOMP_FAKE_CUDA_DRIVER_VERSION (the CUDA version the driver supports, as
cudaDriverGetVersion reports it: 12080 is 12.8) replaces the driver's answer here and nowhere
else, so the check runs on a machine without a GPU; tests/core/test_cuda_requirements.py uses it.
"""
from __future__ import annotations

import mmap
import os
import re

import torch

from . import _C

# The oldest Linux driver each CUDA major runs on (NVIDIA's CUDA toolkit release notes, table 3:
# minor version compatibility); a driver supporting CUDA X.0 runs every X.y runtime.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}
# nvcc writes this into every fatbinary it links; the static cudart comes from the same toolkit
_NVCC_MARK = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")
_ready: set[tuple[str, str | None]] = set()  # (library, faked driver) found usable: checked once


def library_path() -> str:
    """Where _C's loader (csrc/backend_cuda/fc_cuda_loader.c) looks for the CUDA library: $FSDPCOMP_CUDA_LIB,
    else _fsdpcomp_cuda.so next to _C."""
    return os.environ.get("FSDPCOMP_CUDA_LIB") or os.path.join(os.path.dirname(_C.__file__), "_fsdpcomp_cuda.so")


def library_cuda_version(path: str) -> tuple[int, int] | None:
    """The CUDA release (major, minor) the library at ``path`` was built with, read from nvcc's
    mark in its bytes without loading it; None when there is none (a host emulation)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found = _NVCC_MARK.search(m)
            return (int(found.group(1)), int(found.group(2))) if found else None
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses size 0)
        return None


def driver_cuda_version() -> int | None:
    """The CUDA version the installed driver supports (12080 for 12.8), or None where torch
    cannot say (a CPU-only torch, no driver). FSDPCOMP_FAKE_CUDA_DRIVER_VERSION overrides it."""
    fake = os.environ.get("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION")
    if fake:
        if not fake.isdigit():
            raise ValueError(f"FSDPCOMP_FAKE_CUDA_DRIVER_VERSION must be an integer like 12080, got {fake!r}")
        return int(fake)
    get = getattr(torch._C, "_cuda_getDriverVersion", None)  # only on CUDA builds of torch
    try:
        version = get() if get is not None else 0
    except RuntimeError:
        return None
    return version or None


def driver_release(proc: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel module's version (e.g. 575.57.08) from its first line in ``proc``
    ("... Kernel Module  575.57.08 ...", or "... Open Kernel Module for x86_64  575.57.08 ..."),
    or None where it cannot be read."""
    try:
        with open(proc, encoding="ascii", errors="replace") as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def cuda_problem(what: str, *, path: str, built: tuple[int, int] | None, driver: int | None,
                 release: str | None = None) -> str | None:
    """What stops ``what`` (tensors on a CUDA device) from running, as a message saying what to
    do, or None. path: the CUDA library's; built: the CUDA it was built with (None: unknown);
    driver: the CUDA version the driver supports (None: unknown); release: the driver's version."""
    if not os.path.exists(path):
        where = (f"FSDPCOMP_CUDA_LIB={path} does not exist" if os.environ.get("FSDPCOMP_CUDA_LIB")
                 else f"there is no {path}")
        return (f"{what} on a CUDA device, but this fsdpcomp was built without CUDA ({where}). "
                "Rebuild it with nvcc on PATH (or NVCC / CUDA_HOME set) and FSDPCOMP_CUDA=1, which "
                "stops the build when nvcc is missing instead of building for the CPU only: "
                "`FSDPCOMP_CUDA=1 pip install .` (a source checkout: `FSDPCOMP_CUDA=1 python setup.py "
                "build_ext --inplace`).")
    if built is None or driver is None or driver // 1000 >= built[0]:
        return None
    need = MIN_DRIVER.get(built[0])
    has = f"the installed NVIDIA driver{f' ({release})' if release else ''} supports CUDA up to " \
          f"{driver // 1000}.{driver % 1000 // 10}"
    return (f"{what} on a CUDA device, but fsdpcomp's CUDA library ({path}) was built with CUDA "
            f"{built[0]}.{built[1]}, which needs an NVIDIA driver "
            f"{f'>= {need}' if need else f'that supports CUDA {built[0]}'}, and {has}. Upgrade the "
            f"driver{f' to {need} or newer' if need else ''}, or rebuild fsdpcomp with a CUDA toolkit "
            f"of at most {driver // 1000}.{driver % 1000 // 10} (its nvcc first on PATH, FSDPCOMP_CUDA=1).")


def require_cuda(what: str) -> None:
    """Raises fsdpcomp.CudaError with cuda_problem's message when this machine cannot run
    fsdpcomp on CUDA tensors; once a library has passed, later calls return at once."""
    path = library_path()
    key = (path, os.environ.get("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION"))
    if key in _ready:
        return
    problem = cuda_problem(what, path=path, built=library_cuda_version(path), driver=driver_cuda_version(),
                           release=driver_release())
    if problem is not None:
        raise _C.CudaError(problem)
    _ready.add(key)

