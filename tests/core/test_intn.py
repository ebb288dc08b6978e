"""intN beyond the generic method tests: every width (2, 3, 4 bits), the exact packing of 3-bit
codes (8 per 3 bytes), the byte formula, error bounds per rounding mode, unbiasedness with a
control that nearest rounding fails, special blocks, and the `bits` range."""
import math

import pytest
import torch

import fsdpcomp
from fsdpcomp import _C

HEADER = _C.HEADER_BYTES


def cdiv(a, b):
    return -(-a // b)


def state(cfg):
    return _C.State("intN", dict(cfg, error_feedback=False, seed=3))


def encode(s, x, chunk=0):
    buf = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, buf, chunk=chunk)
    return buf[:w].clone()


def decode(s, p, n, chunk=0):
    d = torch.zeros(n)
    s.decompress(p, d, chunk=chunk)
    return d


def unpack(body_codes, bits, n):
    """Codes of a packed body, read as documented: element i at bit i * bits, little-endian."""
    as_int = int.from_bytes(bytes(body_codes.tolist()), "little")
    return [(as_int >> (bits * i)) & ((1 << bits) - 1) for i in range(n)]


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 250, 1000])
def test_body_is_bits_times_groups_plus_one_scale_per_block(bits, n, gen):
    bs = 64
    s = state({"bits": bits, "block_size": bs})
    x = torch.randn(n, generator=gen)
    p = encode(s, x)
    body = bits * cdiv(n, 8) + 4 * cdiv(n, bs)
    assert p.numel() == cdiv(HEADER + body, 16) * 16
    lay = s.layout(n)
    assert (lay["value_bytes"], lay["meta_bytes"], lay["index_bytes"]) == (bits * cdiv(n, 8), 4 * cdiv(n, bs), 0)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_codes_are_packed_at_bit_i_times_bits(bits, gen):
    """Decoding the bytes by hand, from the documented layout, gives back the decoder's values."""
    n, bs = 203, 64  # a partial last group and a partial last block
    qmax = 2 ** (bits - 1) - 1
    s = state({"bits": bits, "block_size": bs})
    x = torch.randn(n, generator=gen)
    p = encode(s, x)
    nb = cdiv(n, bs)
    scales = p[HEADER:HEADER + 4 * nb].view(torch.float32)
    packed = p[HEADER + 4 * nb:HEADER + 4 * nb + bits * cdiv(n, 8)]
    codes = unpack(packed, bits, cdiv(n, 8) * 8)
    assert all(c == 0 for c in codes[n:])  # the last group's unused slots
    assert all(0 <= c <= 2 * qmax for c in codes[:n])
    by_hand = torch.tensor([float(scales[i // bs]) * (c - qmax) for i, c in enumerate(codes[:n])])
    torch.testing.assert_close(decode(s, p, n), by_hand, rtol=0, atol=0)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("stochastic", [False, True])
def test_error_within_half_a_step_or_one_step(bits, stochastic, gen):
    n, bs = 4099, 128
    qmax = 2 ** (bits - 1) - 1
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) * 10
    s = state({"bits": bits, "block_size": bs, "stochastic": stochastic})
    d = decode(s, encode(s, x), n)
    pad = torch.cat([x, x.new_zeros(cdiv(n, bs) * bs - n)]).view(-1, bs)
    step = (pad.abs().amax(1) / qmax).repeat_interleave(bs)[:n]
    bound = step if stochastic else step / 2
    assert ((d - x).abs() <= bound * (1 + 1e-5)).all()
    # and the quantiser uses its levels: the error is not trivially zero
    assert (d != x).any()


def test_three_bits_is_ten_times_smaller_than_fp32():
    s = state({"bits": 3})
    n = 1 << 20
    lay = s.layout(n)
    bits_per_element = 8 * (lay["value_bytes"] + lay["meta_bytes"]) / n
    assert bits_per_element == 3 + 32 / 256
    assert 32 / bits_per_element > 10


def mean_z(cfg, x, draws):
    """Per-element z-scores of the mean decode over `draws` independent streams."""
    s = state(cfg)
    outs = torch.stack([decode(s, encode(s, x, chunk=t), x.numel(), chunk=t).double() for t in range(draws)])
    sd = outs.std(0)
    varied = sd > 0
    return (outs.mean(0) - x.double())[varied] / (sd[varied] / math.sqrt(draws)), varied


@pytest.mark.parametrize("bits", [3, 4])
def test_stochastic_rounding_is_unbiased_and_nearest_is_not(bits, gen):
    x = torch.randn(256, generator=gen)
    z, varied = mean_z({"bits": bits, "stochastic": True, "block_size": 64}, x, 300)
    assert varied.float().mean() > 0.9
    assert abs(float(z.mean())) < 5 / math.sqrt(z.numel()) and float(z.pow(2).mean().sqrt()) < 1.3
    # control: nearest rounding never varies, and its mean misses x on most elements
    s = state({"bits": bits, "block_size": 64})
    d = decode(s, encode(s, x), x.numel())
    assert float((d != x).float().mean()) > 0.9


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_special_blocks(bits, gen):
    bs = 64
    x = torch.randn(5 * bs, generator=gen)
    x[:bs] = 0                          # zeros: exact
    x[bs + 5] = float("nan")            # NaN: its block decodes to NaN, the others are untouched
    x[2 * bs:3 * bs] *= 1e-30           # below 2^-64: pre-scaled, still its own scale
    x[3 * bs:4 * bs] *= 1e-39           # subnormal: qmax / amax would overflow fp32
    s = state({"bits": bits, "block_size": bs})
    d = decode(s, encode(s, x), x.numel())
    assert torch.equal(d[:bs], torch.zeros(bs))
    assert d[bs:2 * bs].isnan().all()
    qmax = 2 ** (bits - 1) - 1
    for lo in (2 * bs, 3 * bs):
        got, ref = d[lo:lo + bs], x[lo:lo + bs]
        # half a step, plus a few subnormal spacings for the rounded scale and product
        assert ((got - ref).abs() <= ref.abs().max() / qmax / 2 * (1 + 1e-5) + 4 * 2.0 ** -149).all()
        assert (got != 0).any()
    assert torch.isfinite(d[4 * bs:]).all()


@pytest.mark.parametrize("bad", [1, 5, 8, 0, -2])
def test_bits_range_is_checked(bad):
    with pytest.raises(ValueError, match=r"bits.*" + str(bad)):
        fsdpcomp.CommState("intN", {"bits": bad})


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_every_width_is_accepted(bits):
    assert fsdpcomp.CommState("intN", {"bits": bits}) is not None


# ---- scheme "minmax": per block (min, step), codes 0 .. 2^bits - 1 ----

def minmax_parts(p, n, bits, bs):
    nb = cdiv(n, bs)
    meta = p[HEADER:HEADER + 8 * nb].view(torch.float32).view(nb, 2)
    codes = unpack(p[HEADER + 8 * nb:HEADER + 8 * nb + bits * cdiv(n, 8)], bits, cdiv(n, 8) * 8)
    return meta[:, 0], meta[:, 1], codes


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_minmax_layout_and_decode_by_hand(bits, gen):
    n, bs = 203, 64
    levels = 2 ** bits - 1
    s = state({"bits": bits, "block_size": bs, "scheme": "minmax"})
    x = torch.randn(n, generator=gen) * 2 + 0.5
    p = encode(s, x)
    body = bits * cdiv(n, 8) + 8 * cdiv(n, bs)
    assert p.numel() == cdiv(HEADER + body, 16) * 16
    assert s.layout(n)["meta_bytes"] == 8 * cdiv(n, bs)
    mins, steps, codes = minmax_parts(p, n, bits, bs)
    assert all(c == 0 for c in codes[n:])
    for b in range(cdiv(n, bs)):
        blk = x[b * bs:(b + 1) * bs]
        assert float(mins[b]) == float(blk.min())
        assert float(steps[b]) == float((blk.max() - blk.min()) / levels)  # fp32 M - m, then / L
        # nearest rounding puts the block's min on code 0 and its max on the top code
        got = codes[b * bs:min(n, (b + 1) * bs)]
        assert min(got) == 0 and max(got) == levels
    q = torch.tensor(codes[:n], dtype=torch.float32)
    idx = torch.arange(n) // bs
    by_hand = mins[idx] + q * steps[idx]  # fp32, two rounded operations, no fma
    assert torch.equal(decode(s, p, n).view(torch.int32), by_hand.view(torch.int32))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("stochastic", [False, True])
def test_minmax_error_within_half_a_step_or_one_step(bits, stochastic, gen):
    n, bs = 4096, 256
    x = torch.randn(n, generator=gen).abs() * 3 + 1  # one-signed: where min-max beats absmax
    s = state({"bits": bits, "block_size": bs, "scheme": "minmax", "stochastic": stochastic})
    d = decode(s, encode(s, x), n)
    xb = x.view(-1, bs)
    step = ((xb.amax(1) - xb.amin(1)) / (2 ** bits - 1)).repeat_interleave(bs)
    bound = step if stochastic else step / 2
    assert ((d - x).abs() <= bound * (1 + 1e-5) + 1e-6 * float(x.abs().max())).all()
    # on one-signed data the min-max error is well below the absmax one at the same width
    a = state({"bits": bits, "block_size": bs, "stochastic": stochastic})
    da = decode(a, encode(a, x), n)
    assert float((d - x).norm()) < 0.75 * float((da - x).norm())


@pytest.mark.parametrize("bits", [2, 3])
def test_minmax_stochastic_is_unbiased_and_nearest_is_not(bits, gen):
    x = torch.randn(256, generator=gen) + 0.3
    z, varied = mean_z({"bits": bits, "stochastic": True, "block_size": 64, "scheme": "minmax"}, x, 300)
    assert varied.float().mean() > 0.9
    assert abs(float(z.mean())) < 5 / math.sqrt(z.numel()) and float(z.pow(2).mean().sqrt()) < 1.3
    _, varied_nearest = mean_z({"bits": bits, "block_size": 64, "scheme": "minmax"}, x, 3)
    assert not varied_nearest.any()  # nearest never varies: its mean is its (biased) value


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_minmax_special_blocks(bits, gen):
    bs = 64
    x = torch.randn(6 * bs, generator=gen)
    x[:bs] = 0                                   # zeros: exact
    x[bs:2 * bs] = -2.75                         # constant: exact
    x[2 * bs + 9] = float("inf")                 # Inf: the block decodes to NaN
    x[3 * bs:4 * bs] *= 1e-39                    # subnormal range: levels / range overflows fp32
    x[4 * bs] = 3e38                             # range beyond fp32: saturated at +-2^126
    x[4 * bs + 1] = -3e38
    s = state({"bits": bits, "block_size": bs, "scheme": "minmax"})
    d = decode(s, encode(s, x), x.numel())
    assert torch.equal(d[:bs], torch.zeros(bs))
    assert torch.equal(d[bs:2 * bs], x[bs:2 * bs])
    assert d[2 * bs:3 * bs].isnan().all()
    got, ref = d[3 * bs:4 * bs], x[3 * bs:4 * bs]
    step = float(ref.max() - ref.min()) / (2 ** bits - 1)
    assert ((got - ref).abs() <= step / 2 * (1 + 1e-5) + 4 * 2.0 ** -149).all()
    sat = d[4 * bs:5 * bs]
    assert torch.isfinite(sat).all() and sat[0] > 2.0 ** 125 and sat[1] < -2.0 ** 125
    assert (sat.abs() <= 2.0 ** 126 * (1 + 1e-6)).all()
    assert torch.isfinite(d[5 * bs:]).all()


def test_scheme_is_checked():
    with pytest.raises(ValueError, match=r"scheme.*'maxabs'"):
        fsdpcomp.CommState("intN", {"scheme": "maxabs"})
