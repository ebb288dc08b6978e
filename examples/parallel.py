"""The data-parallel wrappers fsdp_train.py can use, one function each, all returning a Wrapped:
the wrapped module, its fsdpcomp CommState and the few wrapper-specific operations the script
needs. Adding FSDP2 or DDP means one more function and one entry in WRAPPERS."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

import fsdpcomp

SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


@dataclass
class Wrapped:
    module: torch.nn.Module
    comm: fsdpcomp.CommState
    clip_grad_norm: Callable[[float], torch.Tensor]  # max_norm -> total norm over all ranks
    full_state_dict: Callable[[], dict]               # the unsharded weights (rank 0; {} elsewhere)
    local_params: Callable[[], list[torch.Tensor]]    # what this rank holds, for checkpoints


def wrap_fsdp1(model: torch.nn.Module, comm: fsdpcomp.CommState, *, device: torch.device,
               block_cls: type, sharding: str = "FULL_SHARD", bf16: bool = False) -> Wrapped:
    from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, ShardingStrategy, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if sharding not in SHARDING:
        raise ValueError(f"sharding strategy must be one of {', '.join(SHARDING)}, got {sharding!r}")
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                        buffer_dtype=torch.bfloat16) if bf16 else None
    # FSDP1 refuses sync_module_states for CPU modules; the script seeds every rank alike, so
    # the initial weights already agree there.
    fsdp = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                          transformer_layer_cls={block_cls}),
                sharding_strategy=ShardingStrategy[sharding], mixed_precision=mp, device_id=device,
                sync_module_states=device.type == "cuda", use_orig_params=False)
    fsdpcomp.register(fsdp, comm)

    def full_state_dict() -> dict:
        # offload_to_cpu on a CPU module frees the gathered storage it then reads: GPU only.
        cfg = FullStateDictConfig(offload_to_cpu=device.type == "cuda", rank0_only=True)
        with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, cfg):
            return fsdp.state_dict()

    return Wrapped(fsdp, comm, fsdp.clip_grad_norm_, full_state_dict, lambda: list(fsdp.parameters()))


WRAPPERS = {"fsdp1": wrap_fsdp1}
