"""PowerSGD's error feedback (the core's ef_add / ef_keep, csrc/common/fc_ef.h) through the CUDA
library against the CPU: the same g', the same kept residual bits in every residual_dtype, the
same NaN/Inf and saturation counts, alone and over whole PowerSGD steps.

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from fsdpcomp._layout import Layout
from helpers.cuda_cases import same_bits
from helpers.cuda_device import DEV, on_device, skip_without_device

skip_without_device()

DTYPES = ["fp32", "bf16", "int8"]


def hostile(n: int, gen) -> torch.Tensor:
    """Values near fp32's largest (their sums with a residual overflow), a NaN, an Inf, ordinary ones."""
    g = torch.randn(n, generator=gen)
    g[: n // 4] = g[: n // 4].sign() * 3e38
    g[n // 2] = float("nan")
    g[n // 2 + 1] = float("-inf")
    return g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_ef_add_and_keep_match_cpu(dtype, mode, gen):
    cfg = {"residual_dtype": dtype, "nonfinite": mode, "ef_decay": 0.9, "start_iter": 0}
    cpu, dev = fsdpcomp.CommState("powersgd", cfg), on_device("powersgd", cfg)
    n = 1000
    for st in (cpu, dev):
        st._core.begin(n)
    for step in range(3):
        g, ref = hostile(n, gen), torch.randn(n, generator=gen).clamp(-1, 1) * 3e38
        xa, xb = g.clone(), g.to(DEV, copy=True)
        cpu._core.ef_add(xa, 0)
        dev._core.ef_add(xb, 0)
        assert same_bits(xa, xb.cpu()), f"step {step}: g' differs"
        cpu._core.ef_keep(xa, ref, 0)
        dev._core.ef_keep(xb, ref.to(DEV), 0)
        ea, eb = cpu._core.residuals("factors")[0], dev._core.residuals("factors")[0]
        assert same_bits(ea, eb.cpu()), f"step {step}: the kept residual differs"
    ca, cb = cpu._core.counters(), dev._core.counters()
    assert (ca["nonfinite_in"], ca["saturated"]) == (cb["nonfinite_in"], cb["saturated"])
    assert ca["nonfinite_in"] == 4 and ca["saturated"] > 0  # steps 1 and 2 add: a NaN and an Inf each


@pytest.mark.parametrize("dtype", DTYPES)
def test_powersgd_steps_match_cpu(dtype, gen):
    cfg = {"residual_dtype": dtype, "start_iter": 0, "rank": 2}
    layout = Layout.of_shapes([(24, 10), (10,)])
    cpu, dev = fsdpcomp.CommState("powersgd", cfg), on_device("powersgd", cfg)
    for step in range(3):
        g = torch.randn(250, generator=gen)
        a, b = g.clone(), g.to(DEV, copy=True)
        cpu.all_reduce(a, "w", matrices=layout)
        dev.all_reduce(b, "w", matrices=layout)
        cpu.end_step()
        dev.end_step()
        assert torch.allclose(a, b.cpu(), rtol=1e-5, atol=1e-6), step  # BLAS and cuBLAS may round apart
    assert cpu._core.residuals("factors")[0].dtype == dev._core.residuals("factors")[0].dtype
