"""Strom's +-v variant of thresholdv (`"values": "sign"`): only indices and one sign bit per kept
element travel, each decodes to +-threshold, and the rest of x stays in the residual; the sign
bits are counted as value_bytes, exactly."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

V = 0.75
SIGN = {"threshold": V, "values": "sign"}


def cdiv(a, b):
    return -(-a // b)


def index_bytes(n, k):
    width = 2 if n <= 65536 else 4
    b = cdiv(n, 8) if cdiv(n, 8) < k * width else k * width
    return cdiv(b, 4) * 4


def test_counters_split_index_sign_and_count_bytes_exactly(gen):
    state = fsdpcomp.CommState("thresholdv", dict(SIGN, compress_own_chunk=True))
    want = {"value_bytes": 0, "index_bytes": 0, "meta_bytes": 0, "kept": 0}
    for n in (1, 9, 1000, 70001):  # one element, a partial sign byte, bitmap, 32-bit indices
        x = torch.randn(n, generator=gen) * (0.5 if n == 70001 else 1.0)
        out = torch.empty(n)
        state.reduce_scatter(x, out)  # four units of one step
        k = int((x.abs() > V).sum())
        if n == 1:  # count, index and sign bit fill the same 16 padded bytes as one fp32 value:
            want["value_bytes"] += 4  # no smaller, so the payload goes as `none`, exact
            want["kept"] += 1
            assert torch.equal(out, x)
            continue
        want["value_bytes"] += cdiv(k, 8)
        want["index_bytes"] += index_bytes(n, k)
        want["meta_bytes"] += 4
        want["kept"] += k
    c = state.counters()
    for key in ("value_bytes", "index_bytes", "meta_bytes"):
        assert c[key] == want[key], key
    assert c["header_bytes"] + c["value_bytes"] + c["meta_bytes"] + c["index_bytes"] == c["bytes_sent"]
    assert c["density"] == pytest.approx(want["kept"] / (1 + 9 + 1000 + 70001))
    # against the exact-value variant, the values shrink 32x (rounded up to whole bytes) and
    # nothing else changes
    x = torch.randn(4096, generator=gen)
    k = int((x.abs() > V).sum())
    counts = []
    for cfg in ({"threshold": V}, SIGN):
        s = fsdpcomp.CommState("thresholdv", dict(cfg, compress_own_chunk=True))
        s.reduce_scatter(x, torch.empty(4096))
        counts.append(s.counters())
    assert (counts[0]["value_bytes"], counts[1]["value_bytes"]) == (4 * k, cdiv(k, 8))
    assert counts[0]["index_bytes"] == counts[1]["index_bytes"]


def test_residual_keeps_exactly_what_was_not_sent(gen):
    """e = x - (+-v) on the kept elements and x elsewhere, to the bit; EF is on by default."""
    state = fsdpcomp.CommState("thresholdv", dict(SIGN, compress_own_chunk=True))
    assert state.config["error_feedback"]
    e = torch.zeros(999)
    for _ in range(4):
        g = torch.randn(999, generator=gen)
        out = torch.empty(999)
        state.reduce_scatter(g, out)
        state.end_step()
        x = g + e
        kept = x.abs() > V
        sent = torch.where(kept, torch.sign(x) * V, torch.zeros(()))
        assert torch.equal(out, sent)
        e = own(state.state_dict()).residuals["scatter"][0]
        assert torch.equal(e, x - sent)
        assert kept.any() and (~kept).any()


def _sum_over_ranks(rank, world, seed):
    g = torch.randn(3 * 600, generator=torch.Generator().manual_seed(seed + rank))
    state = fsdpcomp.CommState("thresholdv", dict(SIGN, error_feedback=False))
    out = torch.empty(600)
    state.reduce_scatter(g, out)
    return g, out, state.counters()


@pytest.mark.parametrize("world", [3])
def test_three_gloo_ranks_decode_the_signs_of_their_peers(world):
    results = run_ranks(_sum_over_ranks, world, 77)
    grads = [g for g, _, _ in results]
    for r, (_, out, c) in enumerate(results):
        sl = slice(600 * r, 600 * (r + 1))
        expect = sum(g[sl] if p == r else torch.where(g[sl].abs() > V, torch.sign(g[sl]) * V,
                                                      torch.zeros(()))
                     for p, g in enumerate(grads))
        torch.testing.assert_close(out, expect / world, rtol=0, atol=1e-6)
        assert c["extra_collectives"] == 2  # the size exchange, and the ranks' handshake
        sent = [int((grads[r][600 * p:600 * (p + 1)].abs() > V).sum()) for p in range(world) if p != r]
        assert c["value_bytes"] == sum(cdiv(k, 8) for k in sent)


def test_nan_is_counted_and_never_reaches_the_residual(gen):
    state = fsdpcomp.CommState("thresholdv", dict(SIGN, compress_own_chunk=True))
    g = torch.randn(64, generator=gen)
    state.reduce_scatter(g, torch.empty(64))
    state.end_step()
    e = own(state.state_dict()).residuals["scatter"][0].clone()
    g[3] = float("nan")
    out = torch.empty(64)
    state.reduce_scatter(g, out)
    assert state.counters()["nonfinite_in"] == 1
    assert out[3].abs() == V  # a sign bit carries no NaN: sent as +-v (as a vote would)
    # the old residual went out inside g' = g + e: it is replaced, never kept (delivered twice);
    # the NaN's own entry becomes 0, the others g' - D as always
    r = own(state.state_dict()).residuals["scatter"][0]
    assert torch.isfinite(r).all() and r[3] == 0
    rest = torch.arange(64) != 3
    torch.testing.assert_close((out + r)[rest], (g + e)[rest])


@pytest.mark.parametrize("cfg,pattern", [
    (dict(SIGN, quantize="int8"), r"'quantize' must be \"none\" with \"values\": \"sign\".*got \"int8\""),
    ({"threshold": 0.0, "values": "sign"}, r"'threshold' must be > 0 with \"values\": \"sign\""),
    ({"values": "signs"}, r"'values' must be one of 'exact', 'sign', got 'signs'"),
    ({"values": 1}, r"'values'"),
])
def test_bad_config_is_refused(cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        fsdpcomp.CommState("thresholdv", cfg)


def test_set_padding_bits_are_a_payload_error(gen):
    x = torch.randn(1000, generator=gen)
    s = _C.State("thresholdv", dict(SIGN, error_feedback=False))
    buf = torch.zeros(s.payload_bytes(1000), dtype=torch.uint8)
    w = s.compress(x, buf)
    k = int((x.abs() > V).sum())
    assert k % 8 != 0
    body = _C.HEADER_BYTES + 4 + index_bytes(1000, k)
    buf[body + k // 8] |= 0x80  # the last sign byte's unused top bit
    with pytest.raises(fsdpcomp.PayloadError, match="sign bits past the .* kept elements"):
        s.decompress(buf[:w], torch.zeros(1000))
