"""Where a CommState meets a parallelism: one module each for FSDP1 (fsdp1.py), FSDP2 (fsdp2.py:
reduce-scatter, parameter all-gather, replica all-reduce) and DDP (ddp.py), and ``register``,
which picks one by the model's type. The modules import the state and _checks.py, never each
other."""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist

from ..state import CommState
from ._checks import check_cuda_model, check_model
from .ddp import DDPHookState, ddp_hook, register_ddp
from .fsdp1 import UnitHookState, fsdp_hook, register_fsdp1
from .fsdp2 import AllGather, AllReduceHook, ReduceScatter, fsdp2_modules, register_fsdp2, register_replicate

# What register attaches to, in both of its TypeErrors (not a module; a module of none of these kinds).
MODELS = ("a torch.nn.Module wrapped by FSDP1 (a FullyShardedDataParallel root module), FSDP2 (a model "
          "with fully_shard (FSDPModule) modules) or DDP (a DistributedDataParallel module)")


def register(model: torch.nn.Module, method: str | CommState = "none",
             config: Mapping[str, Any] | str | None = None, *,
             process_group: dist.ProcessGroup | None = None) -> CommState:
    """Registers the compressor on ``model`` and returns its CommState.

    FSDP1 (``FullyShardedDataParallel``, the root instance): ``register_comm_hook`` with
    :func:`fsdp_hook`, and every FSDP instance's hook state bound to its unit (the module's
    name). HYBRID_SHARD strategies are refused by torch itself for comm hooks.
    FSDP2 (a model whose modules are ``FSDPModule``): a :class:`fsdpcomp.ReduceScatter` set on
    every one, keyed by the module's name, and a :class:`fsdpcomp.AllGather` for the parameter
    all-gathers (compressed with the config key ``param_gather``; torch's own all-gather, counted,
    for "none"). DDP (``DistributedDataParallel``): ``register_comm_hook`` with
    :func:`fsdpcomp.ddp_hook`, buckets keyed by their parameters. Every unit's residual stays
    with its key whatever the order of the calls, whichever units sit out a step.

    Errors, raised before anything is registered: fsdpcomp.CudaError for a model on CUDA that
    this fsdpcomp cannot run (built without CUDA, or a driver too old for its CUDA library: the
    message says which and what to do); TypeError for a model of none of these kinds (or no
    torch.nn.Module at all), or a CommState passed together with a config; ValueError for a bad method or config, and for a
    ``param_gather`` other than "none" on FSDP1 or DDP (they have no parameter all-gather hook);
    RuntimeError for a torch without FSDP2's custom collectives.
    """
    check_model(model, "fsdpcomp.register", MODELS)
    check_cuda_model(model)
    if isinstance(method, CommState):
        if config is not None:
            raise TypeError("pass either a CommState or a method name with its config, not both")
        state = method
    else:
        state = CommState(method, config, process_group)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        register_fsdp1(model, state)
    elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
        register_ddp(model, state)
    elif fsdp2_modules(model):
        register_fsdp2(model, state)
    else:
        raise TypeError(f"fsdpcomp.register does not know how to attach to {type(model).__name__}: "
                        f"expected {MODELS}")
    return state


__all__ = ["AllGather", "AllReduceHook", "DDPHookState", "ReduceScatter", "UnitHookState", "ddp_hook",
           "fsdp2_modules", "fsdp_hook", "register", "register_replicate"]
