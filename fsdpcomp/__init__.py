"""fsdpcomp: gradient compression for sharded training.

    state = fsdpcomp.register(model, "int8", {"block_size": 256})   # FSDP1, FSDP2 or DDP
    ...train...
    print(state.counters())
"""
from __future__ import annotations

import os
import sys
from typing import Any

from ._version import TORCH_SUPPORTED as _TORCH_SUPPORTED


def _no_extension(err: ImportError) -> ImportError:
    """What to tell a user whose fsdpcomp has no compiled _C: most often a source checkout on
    sys.path first (the current directory, or PYTHONPATH) hiding an installed build. Python's
    own message for it ("cannot import name '_C' from partially initialized module ... most
    likely due to a circular import") points nowhere near that."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    checkout = os.path.isfile(os.path.join(root, "setup.py")) and os.path.isdir(os.path.join(root, "csrc"))
    others = []
    for entry in sys.path:
        cand = os.path.join(os.path.abspath(entry or os.curdir), "fsdpcomp")
        if os.path.realpath(cand) != os.path.realpath(here) and os.path.isfile(os.path.join(cand, "__init__.py")) \
                and any(name.startswith("_C.") for name in os.listdir(cand)) and cand not in others:
            others.append(cand)
    if checkout:
        what = f"fsdpcomp was imported from {here}, a source checkout whose C extension (fsdpcomp._C) is not built"
        if others:
            what += (f"; it shadows the fsdpcomp installed in {others[0]}, because the checkout comes "
                     "first on sys.path (the current directory, or PYTHONPATH)")
        fix = ("To use the installed package, run from outside the checkout or with `python -P` (no current "
               f"directory on sys.path). To use the checkout, build it in place: `pip install -e {root}` "
               f"(or `python setup.py build_ext --inplace` in {root}).")
    else:
        what = f"fsdpcomp in {here} has no compiled extension (fsdpcomp._C): the install is incomplete"
        fix = "Reinstall it with `pip install .` from the fsdpcomp source."
    return ImportError(f"{what}. {fix}", name="fsdpcomp._C", path=here)


def _no_torch() -> ModuleNotFoundError:
    """What to tell a user whose Python has no torch. Python's own message ("No module named
    'torch'", from whichever fsdpcomp module imports it first) names neither the range this
    fsdpcomp supports nor the build to pick: a bare `pip install torch` on Linux pulls the CUDA
    build, several GB, onto a CPU machine."""
    want = f"torch{_TORCH_SUPPORTED}"
    return ModuleNotFoundError(
        f"fsdpcomp needs PyTorch ({want}), which this Python ({sys.executable}) cannot import. "
        f"Install a CPU build with `pip install \"{want}\" --index-url https://download.pytorch.org/whl/cpu`, "
        "or the CUDA build for your machine with the command https://pytorch.org/get-started/locally/ "
        "gives.", name="torch")


try:
    from . import _C
except ImportError as _err:
    if not any(name.startswith("_C.") for name in os.listdir(os.path.dirname(os.path.abspath(__file__)))):
        raise _no_extension(_err) from _err
    raise  # _C is there but does not load (another Python, a missing library): Python's message says why
from ._C import CudaError, PayloadError
try:
    import torch as _torch  # noqa: F401  (here, before any module that needs it: see _no_torch)
except ModuleNotFoundError as _err:
    if _err.name != "torch":
        raise  # torch is there, one of its own imports is not: Python's message names it
    raise _no_torch() from _err
from . import _methods, _powersgd
from ._cuda_check import library_path
from .cli import add_argparse_args, from_args
from .counters import Counters
from .integrations import (AllGather, AllReduceHook, DDPHookState, ReduceScatter, UnitHookState, ddp_hook,
                           fsdp_hook, register, register_replicate)
from .results import append_result, build_record, combine_counters, read_results
from .state import CommState
from ._version import __version__


def methods() -> list[str]:
    """The registered compressor names, as ``--comm_compress`` accepts them: the chunk codecs
    (codecs()) and powersgd, whose factors go through two all-reduces (_powersgd.py)."""
    return _methods.names()


def codecs() -> list[str]:
    """The chunk codecs of the C method table: every method but powersgd."""
    return list(_C.methods())


# Methods with CUDA kernels: the table in cuda/fc_cu_methods.cu (tests/cuda/test_cuda_build.py checks
# this against the built library's own answer).
_CUDA_METHODS = frozenset({"none", "fp16", "bf16", "int8", "fp8", "intN", "qsgd", "nc", "onebit",
                           "signsgd", "topk", "randomk", "thresholdv", "sketch", "gradiveq", "dct",
                           "adaptive"})


def _cuda_built() -> bool:
    """Whether this build has the CUDA library (where the loader looks for it; not loaded)."""
    return os.path.exists(library_path())


def method_info(name: str) -> dict[str, Any]:
    """A method's summary, properties and config keys (with defaults, ranges and docs), its
    aliases (other names it takes for a value: num_bits for int8 and intN); "cuda": whether it
    takes CUDA tensors in this build. ValueError listing methods() for any other name."""
    _methods.check(name)
    info = _powersgd.info() if name == _powersgd.NAME else _C.method_info(name)
    info["common_keys"] = _C.method_info("")
    # powersgd is torch ops only, on any device CommState takes
    info["cuda"] = (info["name"] in _CUDA_METHODS or name == _powersgd.NAME) and _cuda_built()
    return info


__all__ = [
    "AllGather", "AllReduceHook", "CommState", "Counters", "CudaError", "DDPHookState", "PayloadError",
    "ReduceScatter", "UnitHookState", "__version__", "add_argparse_args", "append_result", "build_record",
    "codecs", "combine_counters", "ddp_hook", "from_args", "fsdp_hook", "method_info", "methods",
    "read_results", "register", "register_replicate",
]
