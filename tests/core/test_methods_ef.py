"""Error feedback for every method: g + e_old == decode(encode(g + e_old)) + e_new elementwise,
and over many steps the sum of what was sent tracks the sum of the gradients (the residual is
exactly the difference and stays bounded)."""
import pytest
import torch

import fsdpcomp
from helpers.method_cases import CASES, case_id


def ef_state(method, cfg, residual_dtype="fp32"):
    # one rank compressing its own chunk: the output is exactly decode(encode(g + e_old))
    return fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True,
                                           residual_dtype=residual_dtype))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_error_feedback_invariant(case, gen):
    method, cfg = case
    state = ef_state(method, cfg)
    n = 3500  # sketch's table (6 KiB) is smaller than the chunk, even against 16 bits: no fallback
    e_old = torch.zeros(n)
    for _ in range(3):
        g = torch.randn(n, generator=gen)
        out = torch.empty(n)
        state.reduce_scatter(g, out)
        state.end_step()
        e_new = state._core.residuals()[0].clone()
        lhs, rhs = g + e_old, out + e_new
        torch.testing.assert_close(rhs, lhs, atol=2e-6 * float(lhs.abs().max()), rtol=0)
        assert e_new.abs().sum() > 0 or method == "none"
        e_old = e_new
    c = state.counters()
    assert c["residual_bytes"] == 4 * n
    torch.testing.assert_close(torch.tensor(c["residual_norm"]), e_old.norm(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sum_of_sent_tracks_sum_of_gradients(case, gen):
    method, cfg = case
    if method == "randomk":
        # scaled by n/k, e = g' - (n/k) g'_picked grows without bound: with error feedback
        # random-k runs unscaled (docs/methods.md)
        cfg = dict(cfg, scale=False)
    state = ef_state(method, cfg)
    # sketch's 6 KiB table is larger than these 4000 bytes: it goes as `none` (exact, e = 0)
    n, steps = 1000, 30
    mu = torch.randn(n, generator=gen)  # a consistent direction, as in training
    sum_g, sum_out = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for _ in range(steps):
        g = mu + 0.5 * torch.randn(n, generator=gen)
        out = torch.empty(n)
        state.reduce_scatter(g, out)
        state.end_step()
        sum_g += g.double()
        sum_out += out.double()
    res = state._core.residuals()  # a unit that goes as `none` keeps no residual: it is exact
    e = res[0].double() if res and res[0] is not None else torch.zeros(n, dtype=torch.float64)
    # telescoping: sum(sent) = sum(g) - e_T exactly (to fp32 rounding of each step)
    torch.testing.assert_close(sum_out, sum_g - e, atol=1e-4 * float(sum_g.abs().max()), rtol=0)
    # and e_T stays bounded: what was not sent is a small part of what accumulated. Not for
    # a fixed-magnitude vote (it sends +-scale whatever the size), nor for gradiveq on
    # gradients with no low-rank slice structure (see the next test for the one it has).
    if method not in ("gradiveq",) and cfg.get("mode") != "majority":
        assert float(e.norm()) < 0.5 * float(sum_g.norm())


def test_gradiveq_learns_the_subspace_of_low_rank_gradients(gen):
    """Slices that live in a 4-dim subspace: the random starting basis misses it, the PCA basis
    learned from the warm-up steps catches it and the error drops to rounding."""
    dim, k, n = 16, 4, 1600
    basis = torch.linalg.qr(torch.randn(dim, k, generator=gen))[0]
    state = fsdpcomp.CommState("gradiveq", {"dim": dim, "k": k, "warmup": 2, "compress_own_chunk": True})
    errs = []
    for _ in range(5):
        g = (basis @ torch.randn(k, n // dim, generator=gen)).T.reshape(-1).contiguous()
        out = torch.empty(n)
        state.reduce_scatter(g, out)
        state.end_step()
        errs.append(float((out - g).norm() / g.norm()))
    assert errs[0] > 0.3  # a random 4-dim basis of a 16-dim space
    assert max(errs[2:]) < 1e-4, errs


def test_bf16_residuals_keep_the_invariant_to_bf16_rounding(gen):
    state = ef_state("topk", {"ratio": 0.05}, residual_dtype="bf16")
    n = 2000
    g = torch.randn(n, generator=gen)
    out = torch.empty(n)
    state.reduce_scatter(g, out)
    state.end_step()
    e = state._core.residuals()[0]
    assert e.dtype == torch.bfloat16
    torch.testing.assert_close(out + e.float(), g, atol=float(g.abs().max()) * 2 ** -8, rtol=0)
    assert state.counters()["residual_bytes"] == 2 * n


@pytest.mark.parametrize("method,cfg", [("int8", {}), ("onebit", {}), ("topk", {"ratio": 0.1})])
def test_error_statistics_with_error_feedback(method, cfg, gen):
    # every call sampled: the relative error and cosine come from the residual update's sums
    state = fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True,
                                            error_stats_every=1))
    n = 4099  # not a multiple of the 8 partial sums
    g = torch.randn(n, generator=gen)
    out = torch.empty(n)
    state.reduce_scatter(g, out)
    state.end_step()
    e = state._core.residuals()[0]
    c = state.counters()
    g64, d64 = g.double(), out.double()
    torch.testing.assert_close(torch.tensor(c["grad_rel_error"], dtype=torch.float64),
                               e.double().norm() / g64.norm(), rtol=1e-5, atol=0)
    cos = (g64 @ d64) / (g64.norm() * d64.norm())
    torch.testing.assert_close(torch.tensor(c["grad_cos_sim"], dtype=torch.float64), cos, rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(c["residual_norm"], dtype=torch.float64), e.double().norm(),
                               rtol=1e-5, atol=0)


def test_error_statistics_in_zero_mode_skip_the_zeroed_values(gen):
    # "zero" mode takes this rank's NaN/Inf as 0 and the chunk goes out finite, so it may be the
    # sampled one: its sums pair e with g' as the encode made it (NaN/Inf as 0), not with g + e
    # read again from the input (which made every statistic NaN)
    state = fsdpcomp.CommState("int8", dict(error_feedback=True, compress_own_chunk=True, error_stats_every=1,
                                            nonfinite="zero"))
    n = 4099
    g = torch.randn(n, generator=gen)
    g[7], g[2000] = float("nan"), float("-inf")
    out = torch.empty(n)
    state.reduce_scatter(g, out)
    state.end_step()
    e = state._core.residuals()[0]
    c = state.counters()
    g64 = torch.nan_to_num(g.double(), nan=0.0, posinf=0.0, neginf=0.0)
    d64 = out.double()
    assert torch.isfinite(d64).all()
    torch.testing.assert_close(torch.tensor(c["grad_rel_error"], dtype=torch.float64),
                               e.double().norm() / g64.norm(), rtol=1e-5, atol=0)
    cos = (g64 @ d64) / (g64.norm() * d64.norm())
    torch.testing.assert_close(torch.tensor(c["grad_cos_sim"], dtype=torch.float64), cos, rtol=1e-5, atol=0)
