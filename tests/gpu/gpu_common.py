"""What the GPU checks share: which methods have CUDA kernels in this build, their configs
(tests/helpers/method_cases.py plus each method's defaults), bit comparison, and Skip.

FSDPCOMP_TEST_EMULATED=1 (run.sh --emulated, CI): no GPU; _C drives the emulated CUDA library
(tests/cuda_emu, FSDPCOMP_CUDA_LIB), CPU tensors standing for CUDA ones (DEV is "cpu", the
device's States are dev_state's). Checks that need the hardware (NCCL, memory, timing) skip."""
from __future__ import annotations

import os

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


EMULATED = os.environ.get("FSDPCOMP_TEST_EMULATED") == "1"
DEV = "cpu" if EMULATED else "cuda"


def need_gpu() -> None:
    """The CUDA library is usable: on a GPU, or emulated."""
    if not EMULATED and not torch.cuda.is_available():
        raise Skip("no CUDA device")
    info = fsdpcomp._C.cuda_info()
    if not info["available"]:
        raise Skip("the CUDA library is not usable: " + str(info["error"]))


def need_real_gpu(what: str) -> None:
    """A check that needs the hardware itself (NCCL, GPU memory, timing, a CUDA torch)."""
    if EMULATED:
        raise Skip(f"emulated run: {what} needs a GPU")
    need_gpu()


def dev_state(method: str, cfg: dict) -> fsdpcomp.CommState:
    """A State whose tensors go through the CUDA library (emulated: its CPU tensors do)."""
    st = fsdpcomp.CommState(method, cfg)
    if EMULATED:
        st._core._emulate_cuda(True)
    return st


def to_dev(t: torch.Tensor) -> torch.Tensor:
    """The device's own copy (never the same tensor, also where DEV is the CPU)."""
    return t.to(DEV, copy=True)


def sync() -> None:
    if not EMULATED:
        torch.cuda.synchronize()


def _probe(method: str) -> bool:
    """A CUDA tensor either encodes or says the method has no kernels (a TypeError)."""
    st = dev_state(method, {"compress_own_chunk": True})
    g = torch.randn(64, device=DEV)
    s, _ = st._core.plan(g, 1, 0)
    try:
        st._core.encode(g, torch.empty(sum(s), dtype=torch.uint8, device=DEV), 1, 0, st._core.begin(64))
    except TypeError:
        return False
    return True


def cuda_methods() -> list[str]:
    """Methods whose method_info says "cuda" (probed where this build's method_info has no
    such key yet)."""
    out = []
    for m in fsdpcomp.codecs():
        info = fsdpcomp.method_info(m)
        has = info["cuda"] if "cuda" in info else _probe(m)
        if has:
            out.append(m)
    return out


def cuda_configs() -> list[tuple[str, dict]]:
    # adaptive's sizes follow a unit's parts table (plan() takes the unit): the byte checks here
    # plan without one; tests/cuda/test_cuda_adaptive.py checks it on the device
    ms = set(cuda_methods()) - {"adaptive"}
    out = [c for c in CASES if c[0] in ms]
    out += [(m, {}) for m in sorted(ms) if (m, {}) not in out]
    return out


def case_name(method: str, cfg: dict) -> str:
    return method + "".join(f"-{k}={v}" for k, v in cfg.items())


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(_BITS[t.element_size()]) if t.is_floating_point() else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, NaN payloads and signed zeros included: every path writes the
    canonical NaN, so another NaN (or -0.0 for 0.0) is a difference."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(_bits(a), _bits(b)))


def first_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """The first index whose bits differ (-1: none; a shape mismatch: the shorter length)."""
    x, y = _bits(a).flatten(), _bits(b).flatten()
    if x.numel() != y.numel():
        return min(x.numel(), y.numel())
    d = (x != y).nonzero()
    return int(d[0]) if d.numel() else -1
