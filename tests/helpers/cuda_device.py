"""Where the CUDA test files run, and their backend: on a GPU machine (tests/gpu/run.sh) on the
device, or without one on the host emulation of cuda/ (tests/cuda/test_cuda_files_emulated.py
sets FSDPCOMP_TEST_EMULATED=1: the real _C drives tests/cuda_emu's library, CPU tensors standing
for CUDA ones). One copy of the skip, the device and the State that goes down the CUDA path."""
from __future__ import annotations

import os

import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.cuda_cases import residual_of

EMULATED = os.environ.get("FSDPCOMP_TEST_EMULATED") == "1"
DEV = "cpu" if EMULATED else "cuda"


def skip_without_device(emulation: bool = True) -> None:
    """At a test module's top: skips it (with the reason) where it cannot run. emulation False:
    a file that needs the hardware itself."""
    if EMULATED and emulation:
        return
    where = "a GPU machine (tests/gpu/run.sh)" + (
        ", or emulated (tests/cuda/test_cuda_files_emulated.py)" if emulation else "")
    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device: runs on {where}", allow_module_level=True)
    if not _C.cuda_info()["available"]:
        pytest.skip("CUDA library not usable: " + str(_C.cuda_info()["error"]), allow_module_level=True)


def on_device(method: str, cfg: dict) -> fsdpcomp.CommState:
    """A State whose tensors go through the CUDA library (emulated: CPU tensors do), with the
    CPU reference's config: the same header fingerprint."""
    st = fsdpcomp.CommState(method, cfg)
    if EMULATED:
        st._core._emulate_cuda(True)
    return st


class OnDevice:
    """The backend of tests/helpers/cuda_cases.py's checks: State._core through the CUDA library."""

    def state(self, method: str, cfg: dict):
        return on_device(method, cfg)

    def encode(self, st, grad: torch.Tensor, world: int, rank: int) -> torch.Tensor:
        g = grad.to(DEV, copy=True)
        self.unit = st._core.begin(g.numel())
        s, _ = st._core.plan(g, world, rank)
        send = torch.full((sum(s),), 0xA5, dtype=torch.uint8, device=DEV)  # unwritten bytes show
        sizes = st._core.encode(g, send, world, rank, self.unit)
        return send[:sum(sizes)].cpu()  # data-dependent sizes: the payloads, not the plan

    def residual(self, st):
        r = residual_of(st, self.unit)
        return None if r is None else r.cpu()

    def saturated(self, st) -> int:
        return st.counters()["saturated"]

    def end_step(self, st) -> None:
        st.end_step()

    def decode(self, method: str, cfg: dict, recv: torch.Tensor, grad: torch.Tensor, out_numel: int,
               world: int, rank: int):
        st = on_device(method, cfg)
        out = torch.full((out_numel,), 7.0, dtype=grad.dtype, device=DEV)
        st._core.decode(recv.to(DEV, copy=True), grad.to(DEV, copy=True), out, world, rank,
                        st._core.begin(grad.numel()))
        return out.cpu(), dict(st.counters())
