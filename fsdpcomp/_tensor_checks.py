"""What a tensor handed to fsdpcomp must be, each rule written once with one message: CommState's
calls (a gradient and its output) and the integrations' (FSDP2's flat buffers) check through
here. TypeError for what a tensor is (not a tensor, a dtype or device the codecs cannot read),
ValueError for its layout."""
from __future__ import annotations

from typing import Any

import torch

from ._cuda_check import require_cuda

FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # the dtypes the codecs read


def check_kind(t: Any, name: str, floats: bool = True, hint: str = "") -> None:
    """A torch.Tensor; floats: of a dtype the codecs read (hint: why another dtype came)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if floats and t.dtype not in FLOATS:
        raise TypeError(f"{name} must be float32, bfloat16 or float16{hint}, got {t.dtype}")


def check_grad(t: Any, name: str) -> None:
    """What every gradient tensor a hook call reduces must be, checked before the call claims
    its unit: a float tensor on the CPU or a CUDA device fsdpcomp can run on, contiguous."""
    check_kind(t, name)
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} must be on the CPU or a CUDA device, got {t.device}")
    if t.device.type == "cuda":
        require_cuda(f"{name} is")  # CudaError: no CUDA library, or a driver too old for it
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got shape "
                         f"{tuple(t.shape)} with strides {t.stride()}")


def check_flat(t: Any, name: str, floats: bool = True, hint: str = "") -> None:
    """A flat contiguous tensor; floats: of a dtype the codecs read."""
    check_kind(t, name, floats, hint)
    if t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a flat contiguous tensor, got shape {tuple(t.shape)}")
