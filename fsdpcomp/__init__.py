"""fsdpcomp: gradient compression for sharded training.

    state = fsdpcomp.register(model, "int8", {"block_size": 256})   # FSDP1, FSDP2 or DDP
    ...train...
    print(state.counters())
"""
from __future__ import annotations

from typing import Any

from . import _C
from ._C import CudaError, NcclError, PayloadError
from ._nccl import release_nccl
from .cli import add_argparse_args, from_args
from .counters import Counters
from .ddp import ddp_hook
from .fsdp2 import AllReduceHook, ReduceScatter
from .hooks import fsdp_hook
from .param_gather import AllGather
from .register import register
from .register_fsdp2 import register_replicate
from .results import append_result, build_record, combine_counters, read_results
from .state import CommState

__version__ = "0.1.0"


def methods() -> list[str]:
    """The registered compressor names, as ``--comm_compress`` accepts them."""
    return list(_C.methods())


def method_info(name: str) -> dict[str, Any]:
    """A method's summary, properties and config keys (with defaults, ranges and docs)."""
    info = _C.method_info(name)
    info["common_keys"] = _C.method_info("")
    return info


__all__ = [
    "AllGather", "AllReduceHook", "CommState", "Counters", "CudaError", "NcclError", "PayloadError",
    "ReduceScatter", "__version__", "add_argparse_args", "append_result", "build_record",
    "combine_counters", "ddp_hook", "from_args", "fsdp_hook", "method_info", "methods",
    "read_results", "register", "register_replicate", "release_nccl",
]
