"""The driver's range and NaN rules of csrc/fc_range.h on torch tensors, for the all-gather half
of an all-reduce (_gather.py), whose g' = shard + e and residual e = g' - D are torch ops: the
same values the C driver keeps, so a residual never holds a NaN/Inf the input did not and a sum
of two finite values saturates instead of becoming Inf. Each returns how many values it
saturated as a 0-dim tensor (no host wait on CUDA); the caller adds it to the state's count."""
from __future__ import annotations

import torch

_FMAX = torch.finfo(torch.float32).max


def _max_like(v: torch.Tensor) -> torch.Tensor:
    """fp32's largest value with the sign of each element of v (fc_max_like)."""
    return torch.full_like(v, _FMAX).copysign(v)


def gprime(x: torch.Tensor, shard: torch.Tensor, e: torch.Tensor | None, zero: bool) -> torch.Tensor:
    """Fixes x = shard (+ e) in place where it is NaN/Inf (fc_gprime_fix): a sum of two finite
    values saturates; a NaN/Inf of the shard becomes e (0 without a residual) in "zero" mode and
    stays in "pass" mode (compress() writes a NaN as the canonical one). Returns the count of
    saturated sums."""
    bad = ~torch.isfinite(x)
    if x.device.type == "cpu" and not bool(bad.any()):  # the common case, no pass beyond the check
        return torch.zeros((), dtype=torch.int64)
    finite_in = torch.isfinite(shard) if e is None else torch.isfinite(shard) & torch.isfinite(e)
    sat = bad & finite_in
    x.copy_(torch.where(sat, _max_like(x), x))
    if zero:
        x.copy_(torch.where(bad & ~finite_in, torch.zeros_like(x) if e is None else e, x))
    return sat.sum()


def residual(x: torch.Tensor, d: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = e of the single payload of g' (x) whose decode into zeros is d, as the C driver's
    update_residual: x - d saturated where it is not finite (NaN: 0), or, when x held NaN/Inf
    that went on the wire, fc_residual_passed (0 where x is not finite, x where d is NaN, x - d
    with an infinite d taken as fp32's largest, saturated). Returns the count of saturations."""
    torch.sub(x, d, out=out)
    if x.device.type == "cpu" and bool(torch.isfinite(out).all()) and bool(torch.isfinite(x).all()):
        return torch.zeros((), dtype=torch.int64)
    x_bad = ~torch.isfinite(x)
    passed = x_bad.any()  # a 0-dim tensor: where() picks per call without a host wait
    # a chunk that sent only finite values: fc_residual_fix
    fin_bad = ~torch.isfinite(out)
    fin = torch.where(fin_bad, torch.where(torch.isnan(out), torch.zeros_like(out), _max_like(out)), out)
    # a chunk that passed NaN/Inf: fc_residual_passed
    d_fin = torch.where(torch.isinf(d), _max_like(d), d)
    p = x - d_fin
    p_sat = torch.isfinite(x) & ~torch.isnan(d) & ~torch.isfinite(p)
    p = torch.where(p_sat, _max_like(p), p)
    p = torch.where(torch.isnan(d), x, p)
    p = torch.where(x_bad, torch.zeros_like(p), p)
    out.copy_(torch.where(passed, p, fin))
    return torch.where(passed, p_sat.sum(), fin_bad.sum())
