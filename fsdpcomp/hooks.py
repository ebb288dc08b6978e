"""The FSDP1 communication hook: one function for every sharding strategy FSDP1 allows a hook
for. Register it with ``model.register_comm_hook(state, fsdp_hook)`` or ``fsdpcomp.register``."""
from __future__ import annotations

import torch

from .state import CommState


def fsdp_hook(state: CommState, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    """FULL_SHARD / SHARD_GRAD_OP: ``hook(state, padded_grad, sharded_output)`` fills the output
    with the mean over ranks of this rank's chunk. NO_SHARD: ``hook(state, grad)`` replaces grad
    by the mean over ranks (all-reduce meaning). Any of fp32/bf16/fp16; sums are in fp32."""
    if not isinstance(state, CommState):
        raise TypeError(f"fsdp_hook's state must be a fsdpcomp.CommState, got {type(state).__name__}")
    if output is None:
        state.all_reduce(grad)
    else:
        state.reduce_scatter(grad, output)
