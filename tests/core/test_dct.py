"""The `dct` codec (DeMo's transform codec) and the decaying residual (`ef_decay`): the fast
transform against the textbook matrix, the receivers' coefficient-domain sum against the sum
of the decodes, the ratio it is for, the decay's identity, and the configs it refuses."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers import wire_sim
from helpers.dct_ref import dct_reconstruct


def roundtrip(x, cfg):
    s = _C.State("dct", cfg)
    p = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, p)
    d = torch.zeros_like(x)
    s.decompress(p[:w], d)
    return p[:w], d


@pytest.mark.parametrize("block", [8, 16, 64, 256])
def test_every_coefficient_kept_gives_x_back(block, gen):
    # the fast transform and its inverse are orthonormal to fp32 rounding, padding included
    # (Lee's factors grow to ~B/pi at the last stage: a few ulps more at B = 256)
    x = torch.randn(5 * block + 3, generator=gen)
    _, d = roundtrip(x, {"block": block, "k": block, "quantize": "none"})
    torch.testing.assert_close(d, x, atol=1e-5 * float(x.abs().max()), rtol=0)


@pytest.mark.parametrize("block,k", [(8, 1), (64, 2), (64, 5), (256, 3)])
def test_kept_coefficients_are_the_largest_of_each_block(block, k, gen):
    x = torch.randn(4 * block + block // 2, generator=gen)
    _, d = roundtrip(x, {"block": block, "k": k, "quantize": "none"})
    ref = dct_reconstruct(x, block, k)
    assert (d.double() - ref).abs().max() <= 1e-5 * float(x.abs().max())


def test_smooth_blocks_compress_far_better_than_topk_of_the_same_bytes(gen):
    # the point of the transform: a slowly varying signal puts its energy in few coefficients
    t = torch.linspace(0, 40, 64 * 200)
    x = torch.sin(t) + 0.3 * torch.cos(3.1 * t)
    p, d = roundtrip(x, {"k": 2, "block": 64, "quantize": "fp16"})
    s = _C.State("topk", {"ratio": 2 / 64, "quantize": "fp16"})
    q = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, q)
    dt = torch.zeros_like(x)
    s.decompress(q[:w], dt)
    assert p.numel() <= w
    assert (d - x).norm() < 0.2 * (dt - x).norm()


@pytest.mark.parametrize("quantize", ["none", "nc", "fp16"])
def test_values_near_fp32s_largest_stay_finite(quantize):
    # the unnormalised stages would overflow (Inf - Inf = NaN): such blocks go prescaled
    x = torch.full((200,), 3.0e38)
    x[::3] = -3.3e38
    p, d = roundtrip(x, {"k": 8, "quantize": quantize})
    assert torch.isfinite(d).all()
    if quantize != "fp16":  # fp16 saturates at 65504 (counted): nothing near x comes back
        assert (d.double() - x.double()).norm() < x.double().norm()


def test_a_coefficient_beyond_fp32_is_saturated_and_counted():
    # 64 x 3e38: the DC coefficient is 8 x 3e38, sent as fp32's largest and counted
    state = fsdpcomp.CommState("dct", {"k": 1, "quantize": "none", "compress_own_chunk": True,
                                       "error_feedback": False})
    x, out = torch.full((64,), 3.0e38), torch.empty(64)
    state.reduce_scatter(x, out)
    assert state.counters()["saturated"] == 1 and torch.isfinite(out).all()


def test_default_ratio_is_over_32x():
    n = 1 << 20
    s = _C.State("dct", {})
    ratio = 4 * n / s.payload_bytes(n)
    # 12 of 128 coefficients: their positions as one 55-bit rank of the C(128, 12) subsets (84
    # bits as 7-bit indices), 3-bit values, a scale per 256 values: 92.5 bits, 44.3x before the
    # header (33.7x with plain indices)
    assert 44.2 < ratio < 44.35



@pytest.mark.parametrize("k,lo,hi", [(16, 34.9, 35.1), (17, 33.2, 33.35)])
def test_16_and_17_of_128_keep_over_32x(k, lo, hi):
    # their positions as one two-word rank (67 and 70 bits of the C(128, k) subsets, 112 and 119
    # as 7-bit indices: 25.3x and 23.8x), 3-bit values, a scale per 256 values; measured as the
    # budget's roundtrip sends it, a large random gradient
    from fsdpcomp import _budget
    g = torch.randn(1 << 22, generator=torch.Generator().manual_seed(k))
    cfg = {"block": 128, "k": k, "quantize": "intN", "value_bits": 3}
    out, size = _budget.roundtrip(g, _budget.Candidate("dct", "dct", cfg))
    ratio = 4 * g.numel() / size
    print(f"dct {k} of 128, 3-bit values: {ratio:.2f}x")
    assert ratio >= 32 and lo < ratio < hi
    assert size == _C.State("dct", cfg).payload_bytes(g.numel())
    assert (out - g).norm() < g.norm()

@pytest.mark.parametrize("quantize", ["fp16", "none", "intN"])
def test_receivers_sum_of_coefficients_equals_sum_of_decodes(quantize, gen):
    # 3 ranks: each receiver sums its peers' coefficients and inverts once (the aggregate path);
    # that must be what decoding each payload and adding would give, to fp32 rounding
    world, n = 3, 3 * 640 + 17
    cfg = {"quantize": quantize, "k": 3, "error_feedback": False}
    states = [fsdpcomp.CommState("dct", cfg) for _ in range(world)]
    grads = [torch.randn(n, generator=gen) for _ in range(world)]
    outs = [torch.zeros(-(-n // world)) for _ in range(world)]
    wire_sim.exchange(states, grads, outs)
    for r in range(world):
        start = r * (-(-n // world))
        chunk = slice(start, min(n, start + outs[r].numel()))
        want = grads[r][chunk].double()
        for src in range(world):
            if src != r:
                s, p = _C.State("dct", {"quantize": quantize, "k": 3}), None
                part = grads[src][chunk].contiguous()
                p = torch.zeros(s.payload_bytes(part.numel()), dtype=torch.uint8)
                w = s.compress(part, p, chunk=r, world=world)
                d = torch.zeros_like(part)
                s.decompress(p[:w], d, chunk=r, world=world)
                want += d.double()
        got = outs[r][:chunk.stop - chunk.start].double() * world
        assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("method,cfg", [("dct", {}), ("int8", {}), ("topk", {"ratio": 0.05})])
@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9])
def test_decayed_residual_is_what_the_next_gradient_gets(method, cfg, decay, gen):
    # g' = g + d e_old is sent as D(C(g')) and e_new = g' - D(C(g')) (one rank, own chunk compressed)
    n = 3000
    state = fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True,
                                            ef_decay=decay))
    e_old = torch.zeros(n)
    for _ in range(3):
        g = torch.randn(n, generator=gen)
        out = torch.empty(n)
        state.reduce_scatter(g, out)
        state.end_step()
        e_new = state._core.residuals()[0].clone()
        lhs = g + decay * e_old
        torch.testing.assert_close(out + e_new, lhs, atol=2e-6 * float(lhs.abs().max()), rtol=0)
        e_old = e_new


def test_decay_of_one_is_plain_error_feedback(gen):
    # the default: bytes and residuals equal with and without the key
    g = [torch.randn(2000, generator=gen) for _ in range(3)]
    runs = []
    for extra in ({}, {"ef_decay": 1.0}):
        state = fsdpcomp.CommState("dct", dict(extra, compress_own_chunk=True, error_feedback=True))
        outs = []
        for x in g:
            out = torch.empty_like(x)
            state.reduce_scatter(x, out)
            state.end_step()
            outs.append(out)
        runs.append((torch.stack(outs), state._core.residuals()[0].clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("cfg,words", [
    ({"k": 129}, "exceeds block"),
    ({"block": 48}, "power of two"),
    ({"block": 512}, "block"),
    ({"quantize": "fp16", "value_bits": 3}, "intN"),
    ({"quantize": "intN", "value_bits": 1}, "value_bits"),
    ({"ef_decay": 1.5}, "ef_decay"),
    ({"quantize": "fp16", "value_stochastic": True}, "value_stochastic"),
])
def test_bad_configs_name_the_key(cfg, words):
    with pytest.raises(ValueError, match=words):
        fsdpcomp.CommState("dct", cfg)


def test_a_corrupted_index_order_is_refused(gen):
    # k > block / 2: plain indices (ranks elsewhere: tests/core/test_dct_rank.py)
    x = torch.randn(640, generator=gen)
    s = _C.State("dct", {"k": 40, "block": 64, "quantize": "none"})
    p = torch.zeros(s.payload_bytes(640), dtype=torch.uint8)
    w = s.compress(x, p)
    body = p[_C.HEADER_BYTES:w].clone()
    # indices of block 0 (6 bits each, little-endian): make the second equal the first
    first = int(body[0]) & 63
    word = int(body[0]) | (int(body[1]) << 8)
    word = (word & ~(63 << 6)) | (first << 6)
    body[0], body[1] = word & 0xFF, (word >> 8) & 0xFF
    p[_C.HEADER_BYTES:w] = body
    with pytest.raises(_C.PayloadError, match="dct payload"):
        s.decompress(p[:w], torch.zeros(640))
