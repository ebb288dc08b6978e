"""Which NaN the CPU writes where a block's double sums meet NaN or Inf (qsgd's norm, onebit's
two means), on both CPU paths: always the canonical one (0x7fc00000, FC_NAN_BITS), whatever NaN
payload, sign or lane order the input and the sums had (fc_qsgd_norm, fc_onebit_mean), so the
CUDA kernels, whose arithmetic makes other NaNs, write the same bytes by calling the same rules.
A qsgd bucket with NaN or Inf carries the NaN; a onebit mean carries it where a NaN, or an Inf
times the other sign's zero weight, reached its sum, and Inf where only same-signed Infs did.
Before wire version 3 the CPU wrote x86's NaN of the lane that won (tests pinned that order)."""
import random
import struct

import pytest
import torch

from fsdpcomp import _C

FC_NAN = 0x7FC00000  # the one NaN every fp32 field on the wire carries


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def body(method: str, cfg: dict, x: torch.Tensor) -> torch.Tensor:
    s = _C.State(method, cfg)
    buf = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, buf, chunk=0, world=1)
    return buf[32:w]


def square_term(v: float) -> bool:
    """Whether x * x makes the bucket's sum non-finite."""
    return v != v or v in (float("inf"), float("-inf"))


def positive_term(v: float):  # x * (1 - sign): a NaN, or -Inf * 0
    return v != v or v == float("-inf")


def negative_term(v: float):  # x * sign: a NaN, or +Inf * 0
    return v != v or v == float("inf")


def adversarial_blocks(seed: int, count: int):
    """Blocks with 1-5 NaNs of random payloads and signs and +-Inf, in any lanes."""
    rng = random.Random(seed)
    for _ in range(count):
        bs = rng.choice([8, 16, 64, 256])
        n = rng.choice([bs, max(8, bs - 3), 3 * bs + 5])
        xs = torch.randn(n, generator=torch.Generator().manual_seed(rng.getrandbits(31))).tolist()
        for _ in range(rng.choice([1, 2, 3, 5])):
            i, kind = rng.randrange(n), rng.random()
            if kind < 0.5:
                payload = rng.getrandbits(23) | 1
                xs[i] = f32(0x7F800000 | payload | (0x80000000 if rng.random() < 0.5 else 0))
            else:
                xs[i] = float("inf") if kind < 0.75 else float("-inf")
        yield bs, xs


@pytest.fixture(params=[False, True], ids=["fast", "reference"])
def path(request):
    prev = _C._reference_kernels(request.param)
    yield
    _C._reference_kernels(prev)


def test_qsgd_norm_nan_follows_the_rule(path):
    checked = 0
    for bs, xs in adversarial_blocks(1, 150):
        norms = body("qsgd", {"bucket_size": bs}, torch.tensor(xs))
        nb = -(-len(xs) // bs)
        got = [v & 0xFFFFFFFF for v in norms[:4 * nb].view(torch.int32).tolist()]
        for b in range(nb):
            if any(square_term(v) for v in xs[b * bs:b * bs + bs]):
                assert got[b] == FC_NAN, f"bucket {b} of {bs}: norm 0x{got[b]:08x}"
                checked += 1
    assert checked > 100


def test_onebit_mean_nan_follows_the_rule(path):
    checked = 0
    for bs, xs in adversarial_blocks(2, 150):
        means = body("onebit", {"block_size": bs}, torch.tensor(xs))
        nb = -(-len(xs) // bs)
        got = [v & 0xFFFFFFFF for v in means[:8 * nb].view(torch.int32).tolist()]
        for b in range(nb):
            lo, hi = b * bs, min(len(xs), b * bs + bs)
            pos = sum(1 for v in xs[lo:hi] if not bits(v) >> 31)
            for k, (term, count) in enumerate(((positive_term, pos), (negative_term, hi - lo - pos))):
                if count and any(term(v) for v in xs[lo:hi]):
                    assert got[2 * b + k] == FC_NAN, f"block {b} of {bs}, mean {k}: 0x{got[2 * b + k]:08x}"
                    checked += 1
    assert checked > 100


def test_block_quantisers_write_the_constant_nan(path):
    """fp8, int8 and intN write C's NAN (0x7fc00000, FC_NAN_BITS) for a block with a NaN or Inf,
    whatever the NaN's own bits; nc writes exponent 255."""
    x = torch.randn(512)
    x[3] = f32(0xFFA12345)  # a signalling, negative NaN
    x[300] = float("-inf")
    for method, cfg, width in (("fp8", {}, 1), ("int8", {}, 1), ("intN", {}, 1), ("intN", {"scheme": "minmax"}, 2)):
        meta = body(method, cfg, x)[:4 * width * 2].view(torch.int32).tolist()
        assert [v & 0xFFFFFFFF for v in meta] == [0x7FC00000] * (2 * width), (method, cfg)
    assert body("nc", {}, x)[:8].view(torch.int32).tolist() == [255, 255]
