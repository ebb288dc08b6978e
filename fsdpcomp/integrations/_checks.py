"""The argument checks the integrations share, one per fault, each with one exception type:
TypeError for what an argument is (not a tensor, not a CommState, a dtype or device the call
cannot take), ValueError for whether its value fits (a shape, a size, a config key, an op)."""
from __future__ import annotations

from typing import Any

import torch

from .._cuda_check import require_cuda
from .._tensor_checks import check_flat, check_kind  # noqa: F401 (the integrations' tensor rules)
from ..state import CommState


def check_state(state: Any, who: str) -> None:
    if not isinstance(state, CommState):
        raise TypeError(f"{who}'s state must be a fsdpcomp.CommState, got {type(state).__name__}")


def check_model(model: Any, who: str, expected: str) -> None:
    """TypeError naming what ``model`` is, before anything reads its modules or parameters (an
    object without them would end in an AttributeError from deep inside)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{who}'s model must be {expected}, got {type(model).__name__}")


def check_cuda_model(model: torch.nn.Module) -> None:
    """fsdpcomp.CudaError, before any hook is set, when the model's parameters are on CUDA and
    this fsdpcomp cannot run there (built without CUDA, or a driver too old for its library)."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else ()
    if any(p.device.type == "cuda" for p in params):
        require_cuda(f"{type(model).__name__}'s parameters are")


def check_alike(output: torch.Tensor, input: torch.Tensor) -> None:
    if output.dtype != input.dtype or output.device != input.device:
        raise TypeError(f"output_tensor ({output.dtype}, {output.device}) and input_tensor "
                        f"({input.dtype}, {input.device}) must share dtype and device")


def refuse_param_gather(state: CommState, where: str) -> None:
    """Only FSDP2 has a parameter all-gather fsdpcomp can replace (set_custom_all_gather):
    ValueError for a ``param_gather`` other than "none" anywhere else."""
    codec = state.config["param_gather"]
    if codec != "none":
        raise ValueError(f"config key 'param_gather' is '{codec}', but {where} has no parameter "
                         "all-gather hook (only FSDP2's fully_shard has one): set it to 'none'")


def completed(output: torch.Tensor, async_op: bool):
    """What torch's collectives return: None, or (async_op) a Work; the collective has already
    run on the caller's stream, so the Work is a completed one."""
    if not async_op:
        return None
    fut = torch.futures.Future()
    fut.set_result([output])
    return torch._C._distributed_c10d._create_work_from_future(fut)
