"""The decisions a one-pass encode takes on the device (cuda/fc_cu_onepass.cuh), against the CPU's,
over many calls on one State: its last block writes the headers (the NONFINITE flag from this
call's counts), picks the error sample (the first sent chunk that passes no NaN/Inf), sets the
unit's ||e||^2 and leaves the workspace's per-call part zero, since no call clears it first. A
flag, a sum or a ticket left over from one call would show in a later one's headers, sample or
counters here: NaN/Inf move between chunks from call to call, and one call has them in every
sent chunk (no sample), with and without error feedback, for every one-pass method.

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import cpu_encode, make_grad, residual_of, same_bits
from helpers.cuda_device import OnDevice, on_device, skip_without_device

skip_without_device()

CASES = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("fp8", {}), ("intN", {"bits": 3}),
         ("qsgd", {"levels": 7}), ("nc", {}), ("onebit", {}), ("signsgd", {}),
         ("signsgd", {"mode": "majority"})]
WORLD, RANK, N = 4, 1, 4 * 300 + 7  # chunks 0, 2, 3 sent, the last one short
PER = -(-N // WORLD)


def grad_of(step: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Steps 1-3: NaN/Inf in chunk 0 (the sample moves to chunk 2); step 4: in every sent chunk
    (no sample); the others finite."""
    g = make_grad(N, torch.float32, gen)
    if step in (1, 2, 3):
        g[5 + step] = float("nan") if step != 2 else float("-inf")
    if step == 4:
        for c in (0, 2, 3):
            g[c * PER + 3] = float("inf")
    return g.to(dtype)


# a bf16 gradient's fp16 and bf16 payloads are no smaller than `none`'s: those units go as `none`
PARAMS = [(m, c, d) for m, c in CASES for d in (torch.float32, torch.bfloat16)
          if not (d == torch.bfloat16 and m in ("fp16", "bf16"))]


@pytest.mark.parametrize("ef", [True, False], ids=["ef", "no_ef"])
@pytest.mark.parametrize("method,cfg,dtype", PARAMS,
                         ids=[m + "".join(f"-{k}={v}" for k, v in c.items()) + f"-{str(d)[6:]}" for m, c, d in PARAMS])
def test_one_pass_decisions_over_calls_are_the_cpus(method, cfg, dtype, ef, gen):
    full = dict(cfg, error_feedback=ef, error_stats_every=2, seed=5, compress_own_chunk=False, nonfinite="pass")
    cpu, dev, backend = fsdpcomp.CommState(method, full), on_device(method, full), OnDevice()
    for step in range(8):
        g = grad_of(step, gen, dtype)
        u = cpu._core.begin(N)
        a = cpu_encode(cpu, g, WORLD, RANK, u)
        b = backend.encode(dev, g, WORLD, RANK)
        where = f"{method} {cfg} ef={ef} {dtype} step {step}"
        assert a.shape == b.shape and torch.equal(a, b), f"{where}: payload bytes differ at {(a != b).nonzero()[:8].flatten().tolist()}"
        rc, rd = residual_of(cpu, u), backend.residual(dev)
        assert (rc is None) == (rd is None) and (rc is None or same_bits(rc, rd)), f"{where}: residuals differ"
        cpu.end_step()
        dev.end_step()
    kc, kd = cpu.counters(), dev.counters()
    assert kc["fallback_units"] == 0 and kc["error_samples"] == 3, kc  # steps 0, 2, 6: not 4, NaN/Inf everywhere
    for key in ("nonfinite_in", "error_samples", "chunks_sent", "bytes_sent"):
        assert kd[key] == kc[key], f"{method} {cfg} ef={ef}: {key} {kd[key]} != the CPU's {kc[key]}"
    # sums in double, by warps and atomics on the device: the CPU's in another order
    for key in ("grad_rel_error", "grad_cos_sim", "residual_norm"):
        assert kd[key] == pytest.approx(kc[key], rel=1e-5, abs=1e-9), f"{method} {cfg} ef={ef}: {key}"
