"""A residual that Python keeps (PowerSGD's error e) in the config's ``residual_dtype``: fp32,
bf16, or int8 packed by the C core's rule (csrc/common/fc_res8.h: one fp32 scale per 64 values, one
code per value, stochastic rounding), so every home of a residual shrinks alike."""
from __future__ import annotations

import torch


def keep(core, old: torch.Tensor | None, x: torch.Tensor, residual_dtype: str, unit: int) -> torch.Tensor:
    """x (fp32, contiguous, the caller's own) as the residual to keep; `old` is reused when it fits."""
    if residual_dtype == "bf16":
        return x.to(torch.bfloat16)
    if residual_dtype != "int8":
        return x
    n = core.residual_numel(x.numel())
    if old is None or old.numel() != n or old.dtype != torch.uint8 or old.device != x.device:
        old = torch.empty(n, dtype=torch.uint8, device=x.device)
    core.pack_residual(x.view(-1), old, unit=unit)
    return old


def as_float(core, e: torch.Tensor) -> torch.Tensor:
    """A kept residual in fp32 (unpacked when it is packed int8)."""
    if e.dtype != torch.uint8:
        return e.float()
    n = core.residual_values(e.numel())
    out = torch.empty(n, dtype=torch.float32, device=e.device)
    core.unpack_residual(e, out)
    return out
