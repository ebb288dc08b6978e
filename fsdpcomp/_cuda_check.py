"""Whether this fsdpcomp can take CUDA tensors on this machine, asked before the first one (at
``register`` when the model's parameters are on CUDA, else at the first CommState call with a
CUDA tensor): a build without the CUDA library, or an NVIDIA driver older than the CUDA the
library was built with, is named with what to do, instead of a loader error or cudart's
"driver version is insufficient" from inside the first hook call.

A wheel carries two CUDA libraries (issue 40): _fsdpcomp_cuda.so built with CUDA 13 (drivers of
the 580 branch on) and _fsdpcomp_cuda12.so built with CUDA 12.9 (any driver supporting CUDA 12,
525.60.13 on, by CUDA's minor-version compatibility: it has cubins for each arch it lists, so no
PTX has to be JIT-compiled by an older driver). choose_library picks the newest one the driver
runs, and require_cuda hands that choice to _C's loader before the first load. Overrides:
FSDPCOMP_CUDA_LIBRARY=cu13|cu12 forces one of the two (a GPU run of the CUDA 12 one on a newer
driver); FSDPCOMP_CUDA_LIB=<path> loads that file (tests' emulated library).

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
_versions: dict[tuple[str, int, int], tuple[int, int] | None] = {}  # _built_version's reads
# The CUDA libraries a build can hold, newest first: name -> (file next to _C, CUDA major). The
# file names are also in csrc/backend_cuda/fc_cuda_loader.c (FSDPCOMP_CUDA_LIBRARY) and setup.py.
LIBRARIES = {"cu13": ("_fsdpcomp_cuda.so", 13), "cu12": ("_fsdpcomp_cuda12.so", 12)}


def library_dir() -> str:
    """The folder the CUDA libraries sit in: _C's."""
    return os.path.dirname(_C.__file__)


def built_libraries(folder: str | None = None) -> dict[str, str]:
    """The CUDA libraries this build has, newest first: name -> path."""
    folder = folder or library_dir()
    paths = {name: os.path.join(folder, file) for name, (file, _) in LIBRARIES.items()}
    return {name: p for name, p in paths.items() if os.path.exists(p)}


def forced_library() -> str | None:
    """FSDPCOMP_CUDA_LIBRARY's name (cu13, cu12), or None when unset; ValueError for another value."""
    name = os.environ.get("FSDPCOMP_CUDA_LIBRARY", "").strip()
    if name and name not in LIBRARIES:
        raise ValueError(f"FSDPCOMP_CUDA_LIBRARY must be one of {', '.join(LIBRARIES)}, got {name!r}")
    return name or None


def choose_library(driver: int | None, folder: str | None = None) -> str:
    """The path of the CUDA library to load for a driver supporting CUDA ``driver`` (12080 for
    12.8; None: unknown). FSDPCOMP_CUDA_LIB, then FSDPCOMP_CUDA_LIBRARY win; else the newest built
    library whose CUDA major the driver supports; else, when none runs, the oldest built one (its
    message names the smallest driver upgrade), or the CUDA 13 file when none is built (its
    message says the build has no CUDA)."""
    if os.environ.get("FSDPCOMP_CUDA_LIB"):
        return os.environ["FSDPCOMP_CUDA_LIB"]
    folder = folder or library_dir()
    forced = forced_library()
    if forced is not None:
        return os.path.join(folder, LIBRARIES[forced][0])
    built = built_libraries(folder)
    for name, path in built.items():
        # the CUDA the file was built with (nvcc's mark), else the one its name promises
        major = (_built_version(path) or (LIBRARIES[name][1], 0))[0]
        if driver is None or driver // 1000 >= major:
            return path
    return list(built.values())[-1] if built else os.path.join(folder, LIBRARIES["cu13"][0])


def _built_version(path: str) -> tuple[int, int] | None:
    """library_cuda_version, read once per file version (a 20 MB scan)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _versions:
        _versions[key] = library_cuda_version(path)
    return _versions[key]


def library_name(path: str) -> str | None:
    """cu13 or cu12 for one of the wheel's library files, None for another (FSDPCOMP_CUDA_LIB)."""
    if os.environ.get("FSDPCOMP_CUDA_LIB"):
        return None
    return next((name for name, (file, _) in LIBRARIES.items() if os.path.basename(path) == file), None)


def library_path() -> str:
    """The CUDA library this machine's driver gets (choose_library): where _C's loader
    (csrc/backend_cuda/fc_cuda_loader.c) is pointed before its first load."""
    return choose_library(driver_cuda_version())


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
        if not os.environ.get("FSDPCOMP_CUDA_LIB") and os.environ.get("FSDPCOMP_CUDA_LIBRARY"):
            return (f"{what} on a CUDA device, and FSDPCOMP_CUDA_LIBRARY="
                    f"{os.environ['FSDPCOMP_CUDA_LIBRARY']} asks for {path}, which this build does not "
                    f"have (it has: {', '.join(built_libraries(os.path.dirname(path))) or 'none'}). Unset "
                    "FSDPCOMP_CUDA_LIBRARY to let fsdpcomp choose, or build that library (docs/wheel.md).")
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
    # a library loaded already (a _C.cuda_info() call came first) is the one the process runs
    path = _C.cuda_info()["path"] if _C.cuda_loaded() else library_path()
    key = (path, os.environ.get("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION"))
    if key in _ready:
        return
    problem = cuda_problem(what, path=path, built=library_cuda_version(path), driver=driver_cuda_version(),
                           release=driver_release())
    if problem is not None:
        raise _C.CudaError(problem)
    if not os.environ.get("FSDPCOMP_CUDA_LIB"):  # that one names the file to _C itself
        _C._cuda_choose(path)  # False once a library is loaded: the process keeps that one
    _ready.add(key)


def cuda_info() -> dict:
    """_C.cuda_info() (loads the CUDA library: 'available', 'path', 'error', 'build') for the
    library this driver gets, plus 'library': cu13, cu12 or None (a FSDPCOMP_CUDA_LIB file),
    'built': the libraries this build has, and 'driver_cuda_version' (12080 for 12.8, or None)."""
    driver = driver_cuda_version()
    if not _C.cuda_loaded() and not os.environ.get("FSDPCOMP_CUDA_LIB"):
        _C._cuda_choose(choose_library(driver))
    info = _C.cuda_info()
    info.update(library=library_name(info["path"]), built=sorted(built_libraries()),
                driver_cuda_version=driver)
    return info


def loaded_library() -> str | None:
    """cu13 or cu12 when that library is loaded in this process (never loads one), else None."""
    return library_name(_C.cuda_info()["path"]) if _C.cuda_loaded() else None

