"""Device memory for the C core: every tensor it keeps (residuals, the CUDA workspace) comes from
torch's allocator on the tensor's device, never from cudaMalloc, so torch's caching allocator and
its memory statistics see all of it. Every _C.State that may see a CUDA tensor is given this."""
from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8}  # uint8: packed int8 residuals


def allocate(numel: int, dtype_name: str, like: torch.Tensor) -> torch.Tensor:
    """A zeroed tensor of ``numel`` elements of ``dtype_name`` on ``like``'s device."""
    return torch.zeros(numel, dtype=_DTYPES[dtype_name], device=like.device)
