"""Finite in, finite out: what a wire format cannot represent is saturated (and counted in
`saturated`), the remainder stays in the error-feedback residual; a NaN that passes through is
written as one canonical bit pattern per format (docs/methods.md, "Range and NaN")."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.method_cases import CASES, case_id
from helpers.wire_sim import end_step, exchange

FMAX = torch.finfo(torch.float32).max
ALL = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {})] + CASES


def ef_state(method, cfg, **extra):
    return fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True, **extra))


def one_step(state, g):
    out = torch.empty(g.numel())
    state.reduce_scatter(g, out)
    state.end_step()
    return out


def test_fp16_saturates_and_the_residual_delivers_the_rest():
    # guards the old failure: 1e5 encoded to Inf, the residual became -Inf and stayed
    s = ef_state("fp16", {})
    g = torch.zeros(64)
    g[0], g[5] = 1e5, -3e5
    outs = [one_step(s, g)] + [one_step(s, torch.zeros(64)) for _ in range(6)]
    for o in outs:
        assert torch.isfinite(o).all()
    assert torch.isfinite(s._core.residuals()[0]).all()
    assert outs[0][0] == 65504 and outs[0][5] == -65504
    total = torch.stack(outs).double().sum(0)
    torch.testing.assert_close(total, g.double(), rtol=1e-3, atol=0)
    c = s.counters()
    assert c["saturated"] >= 2 and c["nonfinite_out"] == 0 and c["nonfinite_in"] == 0


def test_fp16_saturates_after_its_predivide():
    a, b = fsdpcomp.CommState("fp16"), fsdpcomp.CommState("fp16")
    # 64 elements: a unit small enough that fp16's payload is no smaller than none's goes as none
    g = [torch.full((64,), 3e5), torch.full((64,), 3e5)]
    outs = [torch.empty(32), torch.empty(32)]
    exchange([a, b], g, outs)
    for o in outs:
        assert torch.isfinite(o).all() and (o > 6e4).all()
    assert a.counters()["fallback_units"] == 0
    assert a.counters()["saturated"] == 32  # rank 0's payload to rank 1: 32 elements beyond 65504 * 2


def test_bf16_near_fp32_max_saturates():
    s = ef_state("bf16", {})
    g = torch.zeros(64)  # a unit of 4 would go as none: bf16's payload would be no smaller
    g[:4] = torch.tensor([3.4e38, -3.4e38, 1.0, FMAX])
    out = one_step(s, g)
    assert torch.isfinite(out).all() and torch.isfinite(s._core.residuals()[0]).all()
    assert out[0] == torch.tensor(0x7F7F, dtype=torch.int16).view(torch.bfloat16).float()
    assert s.counters()["saturated"] == 3


def adversarial(n=4096):
    """Finite values that stress every range: fp32's largest, mixed signs near it, a block of
    subnormals, a block of tiny normals, ordinary values. 4096 elements: method_cases' sketch
    tables (3 x 512 fp32) must be smaller than the unit, or the unit goes as none."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(n, generator=g)
    x[:64] = FMAX * torch.sign(torch.randn(64, generator=g))
    x[64:128] = 3e38 * torch.rand(64, generator=g)
    x[128:192] = torch.randn(64, generator=g) * 1e-39        # subnormals
    x[192:256] = torch.randn(64, generator=g) * 1e-37        # tiny normals: 127 / amax overflows
    x[256:260] = torch.tensor([FMAX, -FMAX, FMAX, -FMAX])
    return x


@pytest.mark.parametrize("case", ALL, ids=case_id)
def test_finite_gradients_give_finite_outputs_and_residuals(case):
    method, cfg = case
    s = ef_state(method, cfg)
    x = adversarial()
    for step in range(3):
        out = one_step(s, x if step == 0 else torch.zeros_like(x))
        assert torch.isfinite(out).all(), (step, out[~torch.isfinite(out)][:4])
        r = s._core.residuals()[0]
        assert torch.isfinite(r).all(), (step, r[~torch.isfinite(r)][:4])
    c = s.counters()
    assert c["nonfinite_out"] == 0 and c["nonfinite_in"] == 0


@pytest.mark.parametrize("case", ALL, ids=case_id)
def test_bf16_residuals_stay_finite(case):
    method, cfg = case
    s = ef_state(method, cfg, residual_dtype="bf16")
    one_step(s, adversarial())
    assert torch.isfinite(s._core.residuals()[0].float()).all()


def test_a_sum_beyond_fp32_saturates_in_the_output():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        big = 3e38 if dtype != torch.float16 else 60000.0
        states = [fsdpcomp.CommState("none"), fsdpcomp.CommState("none")]
        g = [torch.full((8,), big, dtype=dtype), torch.full((8,), big, dtype=dtype)]
        outs = [torch.empty(4, dtype=dtype), torch.empty(4, dtype=dtype)]
        exchange(states, g, outs)
        for o in outs:
            assert torch.isfinite(o).all(), (dtype, o)
        if dtype == torch.float32:
            assert outs[0][0] == FMAX
            assert states[0].counters()["saturated"] == 4


def test_a_nonfinite_input_still_passes_through_the_sum():
    states = [fsdpcomp.CommState("none"), fsdpcomp.CommState("none")]
    g = [torch.full((8,), 3e38), torch.full((8,), 3e38)]
    g[1][1] = float("inf")
    outs = [torch.empty(4), torch.empty(4)]
    exchange(states, g, outs)
    assert torch.isinf(outs[0]).all(), "a chunk that brought an Inf passes Inf (pass mode)"


def test_an_own_nan_passes_at_its_own_element_only():
    """The own chunk's NaN/Inf pass through the sum at their own elements only (fc_output_passes,
    docs/decisions.md "The output's NaN/Inf rule per element"): rank 0's own NaN at element 0
    passes, while elements 1-3, sums of two finite 3e38 (rank 1's payload is finite, its header
    not flagged), saturate at fp32's largest value. Until 2026-11-28 any NaN of the own chunk let
    every overflowed sum of it pass as Inf, a rule the fused CUDA decode could not decide in one
    pass. Both CPU paths: decode (rank order) and decode_part (one payload at a time)."""
    g = [torch.full((8,), 3e38), torch.full((8,), 3e38)]
    g[0][0] = float("nan")
    states = [fsdpcomp.CommState("none"), fsdpcomp.CommState("none")]
    outs = [torch.empty(4), torch.empty(4)]
    exchange(states, g, outs)
    assert torch.isnan(outs[0][0]) and torch.equal(outs[0][1:], torch.full((3,), FMAX)), outs[0]
    c = states[0].counters()
    assert (c["nonfinite_in"], c["nonfinite_out"], c["saturated"]) == (1, 1, 3)
    sender, s = fsdpcomp.CommState("none"), fsdpcomp.CommState("none")
    unit = s._core.begin(8)
    sender._core.begin(8)
    sends, _ = sender._core.plan(g[1], 2, 1)
    buf = torch.empty(sum(sends), dtype=torch.uint8)
    sender._core.encode(g[1], buf, 2, 1, unit)
    out = torch.empty(4)
    s._core.decode_part(torch.empty(0, dtype=torch.uint8), g[0], out, 2, 0, unit, 0, 0)  # the own chunk
    s._core.decode_part(buf[:sends[0]], g[0], out, 2, 0, unit, 1, 0)
    assert torch.equal(out.view(torch.int32), outs[0].view(torch.int32))
    c = s.counters()
    assert (c["nonfinite_in"], c["nonfinite_out"], c["saturated"]) == (1, 1, 3)


NANS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FA00000]


def with_nan(x, bits, at):
    y = x.clone()
    y.view(torch.int32)[at] = torch.tensor(bits, dtype=torch.int64).to(torch.int32)
    return y


@pytest.mark.parametrize("case", ALL, ids=case_id)
def test_a_passed_nan_has_one_bit_pattern_per_format(case):
    method, cfg = case
    x = torch.randn(512, generator=torch.Generator().manual_seed(3))
    payloads = []
    for bits in NANS:
        s = _C.State(method, cfg)
        p = torch.zeros(s.payload_bytes(512), dtype=torch.uint8)
        w = s.compress(with_nan(x, bits, [7, 300]), p, world=2)
        payloads.append(p[:w])
    for p in payloads[1:]:
        assert torch.equal(p, payloads[0]), "NaN bits of the input leaked onto the wire"


def test_canonical_nan_patterns_on_the_wire():
    x = with_nan(torch.ones(16), 0xFFC00001, [2])
    for method, want in (("none", 0x7FC00000), ("fp16", 0x7E00), ("bf16", 0x7FC0)):
        s = _C.State(method, {})
        p = torch.zeros(s.payload_bytes(16), dtype=torch.uint8)
        s.compress(x, p)
        body = p[_C.HEADER_BYTES:]
        v = body.view(torch.int32) if method == "none" else body.view(torch.int16)
        assert int(v[2]) & (0xFFFFFFFF if method == "none" else 0xFFFF) == want, method
    s = _C.State("int8", {"block_size": 8})
    p = torch.zeros(s.payload_bytes(16), dtype=torch.uint8)
    s.compress(x, p)
    assert int(p[_C.HEADER_BYTES:].view(torch.int32)[0]) == 0x7FC00000  # the block's scale
