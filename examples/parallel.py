"""The data-parallel wrappers fsdp_train.py can use, one function each, all returning a Wrapped:
the wrapped module, its fsdpcomp CommState and the few wrapper-specific operations the script
needs. Another wrapper is one more function and one entry in WRAPPERS."""
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


def wrap_fsdp2(model: torch.nn.Module, comm: fsdpcomp.CommState, *, device: torch.device,
               block_cls: type, sharding: str = "FULL_SHARD", bf16: bool = False) -> Wrapped:
    """fully_shard on every block, then the root; fsdpcomp's ReduceScatter on each FSDPModule."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if sharding not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        raise ValueError(f"--parallel fsdp2 takes FULL_SHARD or SHARD_GRAD_OP, got {sharding!r} "
                         "(NO_SHARD is DDP: use --parallel ddp)")
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16
          else MixedPrecisionPolicy())
    reshard = sharding == "FULL_SHARD"  # SHARD_GRAD_OP keeps parameters gathered after forward
    model.to(device)
    for block in [m for m in model.modules() if isinstance(m, block_cls)]:
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    fsdpcomp.register(model, comm)

    def clip(max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_state_dict() -> dict:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts)

    # to_local() is a view of this rank's shard, so checkpoint restore can copy_ into it
    return Wrapped(model, comm, clip, full_state_dict, lambda: [p.to_local() for p in model.parameters()])


def wrap_ddp(model: torch.nn.Module, comm: fsdpcomp.CommState, *, device: torch.device,
             block_cls: type, sharding: str = "FULL_SHARD", bf16: bool = False) -> Wrapped:
    """DistributedDataParallel with fsdpcomp's ddp_hook (compressed reduce-scatter + all-gather)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    del block_cls, sharding  # DDP replicates whole models: nothing to wrap per block
    if bf16:
        raise ValueError("--bf16 is sharded mixed precision (fsdp1/fsdp2); --parallel ddp trains in fp32")
    ddp = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    fsdpcomp.register(ddp, comm)

    def full_state_dict() -> dict:
        if dist.get_rank() != 0:
            return {}
        return {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}

    return Wrapped(ddp, comm, lambda n: torch.nn.utils.clip_grad_norm_(ddp.parameters(), n),
                   full_state_dict, lambda: list(ddp.parameters()))


WRAPPERS = {"fsdp1": wrap_fsdp1, "fsdp2": wrap_fsdp2, "ddp": wrap_ddp}
