"""FSDP2 (``fully_shard``): a compressed reduce-scatter for ``FSDPModule.set_custom_reduce_scatter``
and a compressed cross-replica all-reduce for ``FSDPModule.set_all_reduce_hook`` (hybrid
sharding with a 1-D FSDP mesh)."""
from __future__ import annotations

from typing import Hashable, Sequence

import torch
import torch.distributed as dist

from .state import CommState

try:  # torch >= 2.9 defines the protocol; subclassing it keeps torch's isinstance checks true
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _TorchReduceScatter
except ImportError:  # older torch: the class still works, register() says what is missing
    _TorchReduceScatter = object  # type: ignore[assignment,misc]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _op_scale(op, world: int) -> float:
    """What torch's reduce-scatter with `op` computes, as a multiple of the mean over ranks:
    AVG 1, SUM world, PREMUL_SUM(f) f * world (FSDP2 passes these three, see torch's
    _get_gradient_divide_factors). Anything else has no meaning for gradients."""
    kind = getattr(op, "op", op)  # a ReduceOp instance carries its RedOpType in .op
    if kind == dist.ReduceOp.AVG:
        return 1.0
    if kind == dist.ReduceOp.SUM:
        return float(world)
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if not isinstance(factor, (int, float)):
            raise ValueError(f"op PREMUL_SUM must carry a float factor (ReduceOp.PREMUL_SUM(f)), got {factor!r}")
        return float(factor) * world
    raise ValueError(f"op must be ReduceOp.AVG, SUM or PREMUL_SUM(f) for a gradient reduce-scatter, got {kind}")


class ReduceScatter(_TorchReduceScatter):
    """FSDP2's reduce-scatter, compressed by a CommState.

    ``module.set_custom_reduce_scatter(fsdpcomp.ReduceScatter(state))`` on every FSDPModule
    (``fsdpcomp.register`` does it, one object per module with its name as ``key``). With a
    ``key`` the module keeps its own residual whatever the order of the calls and whichever
    modules sit out a step; without one, units go by call order within a backward.
    """

    def __init__(self, state: CommState, key: Hashable | None = None):
        if not isinstance(state, CommState):
            raise TypeError(f"ReduceScatter's state must be a fsdpcomp.CommState, got {type(state).__name__}")
        self.state = state
        self.key = key

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # Fresh memory each call: FSDP2 keeps the input alive across groups and the output
        # becomes the sharded gradients (views), so neither may be reused.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup | None = None, op=dist.ReduceOp.AVG,
                 async_op: bool = False):
        state = self.state
        reduce_group = group if group is not None else state.process_group
        world = dist.get_world_size(reduce_group) if dist.is_initialized() else 1
        _check_tensors(output_tensor, input_tensor, world)
        scale = _op_scale(op, world)
        _bind_group(state, group)
        if scale == 1.0:
            state.reduce_scatter(input_tensor, output_tensor, self.key)
        else:
            # The mean in fp32, scaled in fp32, then one rounding to the reduce dtype.
            mean = state._typed_buffer("fsdp2_mean", output_tensor.numel(), torch.float32, input_tensor.device)
            state.reduce_scatter(input_tensor, mean, self.key)
            output_tensor.copy_(mean.mul_(scale))
        if not async_op:
            return None
        fut = torch.futures.Future()
        fut.set_result([output_tensor])
        return torch._C._distributed_c10d._create_work_from_future(fut)

    def __repr__(self) -> str:
        return f"fsdpcomp.ReduceScatter({self.state!r}, key={self.key!r})"


def _check_tensors(output: torch.Tensor, input: torch.Tensor, world: int) -> None:
    for name, t in (("output_tensor", output), ("input_tensor", input)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a flat contiguous tensor, got shape {tuple(t.shape)}")
    if output.dtype != input.dtype or output.device != input.device:
        raise ValueError(f"output_tensor ({output.dtype}, {output.device}) and input_tensor "
                         f"({input.dtype}, {input.device}) must share dtype and device")
    if input.numel() != world * output.numel():
        raise ValueError(f"input_tensor has {input.numel()} elements; a reduce-scatter over {world} "
                         f"ranks into output_tensor of {output.numel()} needs {world * output.numel()}")


def _bind_group(state: CommState, group: dist.ProcessGroup | None) -> None:
    """The state reduces over the group FSDP2 passes; one state serves one group."""
    if group is None:
        return
    if state.process_group is None:
        state.process_group = group
    elif state.process_group is not group:
        raise ValueError("this CommState reduces over a different process group than the one FSDP2 "
                         "passed: use one CommState per reduce-scatter group")


class AllReduceHook:
    """``module.set_all_reduce_hook(fsdpcomp.AllReduceHook(state))`` (or
    ``fsdpcomp.register_replicate(model, state)`` on every module): the cross-replica mean of
    the reduce-scatter output, compressed (compressed reduce-scatter + all-gather over
    ``state.process_group``, the replicate group).

    For hybrid sharding run ``fully_shard`` on the 1-D shard mesh and let this hook do the
    replicate dimension: torch's own 2-D HSDP all-reduce has no hook (torch calls the hook
    after it), so it cannot be compressed.
    """

    def __init__(self, state: CommState, key: Hashable | None = None):
        if not isinstance(state, CommState):
            raise TypeError(f"AllReduceHook's state must be a fsdpcomp.CommState, got {type(state).__name__}")
        if state.process_group is None:
            raise ValueError("AllReduceHook's state needs its process_group: the replicate group")
        self.state = state
        self.key = key

    def __call__(self, reduce_output: torch.Tensor) -> None:
        if not isinstance(reduce_output, torch.Tensor):
            raise TypeError(f"reduce_output must be a torch.Tensor, got {type(reduce_output).__name__}")
        if reduce_output.dtype not in _FLOATS or reduce_output.dim() != 1 or not reduce_output.is_contiguous():
            raise ValueError("reduce_output must be a flat contiguous float32/bfloat16/float16 tensor, "
                             f"got {reduce_output.dtype} of shape {tuple(reduce_output.shape)}")
        self.state.all_reduce(reduce_output, self.key)

    def __repr__(self) -> str:
        return f"fsdpcomp.AllReduceHook({self.state!r}, key={self.key!r})"
