"""``fsdpcomp.register(model, method, config)``: attach a compressor to a wrapped model in one line."""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist

from .hooks import UnitHookState, fsdp_hook
from .state import CommState


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
    with its key whatever the order of the calls, whichever units sit out a step. FSDP1 and DDP
    have no parameter all-gather hook: a ``param_gather`` other than "none" is refused there,
    before anything is registered.
    """
    state = method if isinstance(method, CommState) else CommState(method, config, process_group)
    if isinstance(method, CommState) and config is not None:
        raise ValueError("pass either a CommState or a method name with its config, not both")
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, (FSDP, torch.nn.parallel.DistributedDataParallel)):
        refuse_param_gather(state, type(model).__name__)
    if isinstance(model, FSDP):
        if state.process_group is None:
            state.process_group = model.process_group
        model.register_comm_hook(state, fsdp_hook)
        _bind_fsdp1_units(model, state)
        return state
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        from .ddp import DDPHookState, ddp_hook

        if state.process_group is None:
            state.process_group = model.process_group
        model.register_comm_hook(DDPHookState(state, model), ddp_hook)
        return state
    from .register_fsdp2 import fsdp2_modules, register_fsdp2

    if fsdp2_modules(model):
        register_fsdp2(model, state)
        return state
    raise TypeError(
        f"fsdpcomp.register does not know how to attach to {type(model).__name__}: expected a "
        "FullyShardedDataParallel root module, a model with fully_shard (FSDPModule) modules, or "
        "a DistributedDataParallel module")


def _bind_fsdp1_units(root: torch.nn.Module, state: CommState) -> None:
    """torch's register_comm_hook gives every FSDP instance of the root the same hook state;
    each instance gets its own instead, naming its unit, so that FSDP1 skipping a unit's hook
    in a step (no gradient: an unused branch, a frozen layer) shifts no other unit's residual."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name

    for name, module in root.named_modules():
        if isinstance(module, FSDP):
            module._comm_hook_state = UnitHookState(state, clean_tensor_name(name) or "<root>")


def refuse_param_gather(state: CommState, where: str) -> None:
    """Only FSDP2 has a parameter all-gather fsdpcomp can replace (set_custom_all_gather)."""
    codec = state.config["param_gather"]
    if codec != "none":
        raise ValueError(f"config key 'param_gather' is '{codec}', but {where} has no parameter "
                         "all-gather hook (only FSDP2's fully_shard has one): set it to 'none'")
