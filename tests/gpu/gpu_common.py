"""What the GPU checks share: which methods have CUDA kernels in this build, their configs
(tests/helpers/method_cases.py plus each method's defaults), bit comparison, and Skip."""
from __future__ import annotations

import torch

import fsdpcomp
from helpers.method_cases import CASES


class Skip(Exception):
    """Raised by a check that cannot run here; its message is the reason."""


class CheckFailed(AssertionError):
    """A failed check with what it found (the harness puts `detail` into the summary)."""

    def __init__(self, message: str, detail=None):
        super().__init__(message)
        self.detail = detail


def need_gpu() -> None:
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    info = fsdpcomp._C.cuda_info()
    if not info["available"]:
        raise Skip("the CUDA library is not usable: " + str(info["error"]))


def _probe(method: str) -> bool:
    """A CUDA tensor either encodes or says the method has no kernels (a TypeError)."""
    st = fsdpcomp.CommState(method, {"compress_own_chunk": True})
    g = torch.randn(64, device="cuda")
    s, _ = st._core.plan(g, 1, 0)
    try:
        st._core.encode(g, torch.empty(sum(s), dtype=torch.uint8, device="cuda"), 1, 0, st._core.begin(64))
    except TypeError:
        return False
    return True


def cuda_methods() -> list[str]:
    """Methods whose method_info says "cuda" (probed where this build's method_info has no
    such key yet)."""
    out = []
    for m in fsdpcomp.methods():
        info = fsdpcomp.method_info(m)
        has = info["cuda"] if "cuda" in info else _probe(m)
        if has:
            out.append(m)
    return out


def cuda_configs() -> list[tuple[str, dict]]:
    ms = set(cuda_methods())
    out = [c for c in CASES if c[0] in ms]
    out += [(m, {}) for m in sorted(ms) if (m, {}) not in out]
    return out


def case_name(method: str, cfg: dict) -> str:
    return method + "".join(f"-{k}={v}" for k, v in cfg.items())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (float tensors: any NaN equals any NaN)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.uint8:
        return torch.equal(a, b)
    na, nb = torch.isnan(a.float()), torch.isnan(b.float())
    view = torch.int32 if a.element_size() == 4 else torch.int16
    return bool(torch.equal(na, nb) and torch.equal(a.view(view)[~na], b.view(view)[~nb]))


def first_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    d = (a.cpu() != b.cpu()).nonzero()
    return int(d[0]) if d.numel() else -1
