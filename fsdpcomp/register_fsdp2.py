"""Attaching a CommState to a ``fully_shard`` model: one ReduceScatter and one AllGather per FSDPModule."""
from __future__ import annotations

import torch

from .fsdp2 import ReduceScatter
from .param_gather import AllGather
from .state import CommState


def fsdp2_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every FSDPModule in `model`, itself included; [] on a torch without FSDP2."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def register_fsdp2(model: torch.nn.Module, state: CommState) -> None:
    """Sets a ReduceScatter keyed by the module's name and an AllGather numbered by its position
    (the same on every rank) on each FSDPModule; checks them all first so that a refusal leaves
    no module half-registered."""
    modules = fsdp2_modules(model)
    if not hasattr(modules[0][1], "set_custom_reduce_scatter") or not hasattr(modules[0][1], "set_custom_all_gather"):
        raise RuntimeError(
            f"torch {torch.__version__} has fully_shard but no FSDPModule.set_custom_reduce_scatter / "
            "set_custom_all_gather (added in torch 2.9): fsdpcomp cannot compress its collectives; upgrade torch")
    for name, module in modules:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) > 1:
            raise ValueError(f"FSDPModule '{name or '<root>'}' has {len(groups)} parameter groups "
                             "(shard_placement_fn with several meshes): torch allows one custom "
                             "reduce-scatter per module only with a single group")
    for unit, (name, module) in enumerate(modules):
        module.set_custom_reduce_scatter(ReduceScatter(state, key=name or "<root>"))
        module.set_custom_all_gather(AllGather(state, key=name or "<root>", unit=unit, module=module))


def register_replicate(model: torch.nn.Module, state: CommState) -> None:
    """Hybrid sharding done by hand: ``model`` is sharded with ``fully_shard`` on the 1-D shard
    mesh and ``state.process_group`` is the replicate group; every FSDPModule gets an
    AllReduceHook (keyed by its name) that averages its reduce-scatter output across replicas."""
    from .fsdp2 import AllReduceHook
    from .register import refuse_param_gather

    refuse_param_gather(state, "register_replicate (the replica all-reduce)")
    modules = fsdp2_modules(model)
    if not modules:
        raise TypeError(f"{type(model).__name__} has no fully_shard (FSDPModule) modules")
    if not hasattr(modules[0][1], "set_all_reduce_hook"):
        raise RuntimeError(f"torch {torch.__version__} has no FSDPModule.set_all_reduce_hook: upgrade torch")
    for name, module in modules:
        if any(group._is_hsdp for group in module._get_fsdp_state()._fsdp_param_groups):
            raise ValueError(f"FSDPModule '{name or '<root>'}' is sharded on a 2-D (HSDP) mesh: torch runs "
                             "its own replica all-reduce there and calls the hook after it; shard on "
                             "the 1-D shard mesh instead")
    for name, module in modules:
        module.set_all_reduce_hook(AllReduceHook(state, key=name or "<root>"))
