"""Which NaN the CPU writes where a block's double sums meet NaN or Inf (qsgd's norm, onebit's
two means), on both CPU paths: the rule the CUDA kernels reproduce to write the same bytes
(cuda/fc_cu_tile.cuh, fc_cu_nan_key). The sums run in 8 lanes, element i of a block at lo adding
into lane (i - lo) % 8. A NaN term (a NaN's own square or product: that NaN, quieted; Inf * 0:
x86's default NaN, 0xffc00000 as fp32) replaces its lane's value (the lane's last NaN term
wins), and the lanes' tree keeps its left NaN (the lowest lane decides). If a compiler or CPU
changes this, this test fails and the kernels' rule must follow."""
import random
import struct

import pytest
import torch

from fsdpcomp import _C

DEFAULT_NAN = 0xFFC00000


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def body(method: str, cfg: dict, x: torch.Tensor) -> torch.Tensor:
    s = _C.State(method, cfg)
    buf = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, buf, chunk=0, world=1)
    return buf[32:w]


def winner(xs: list, lo: int, hi: int, term) -> int | None:
    """The rule: of the elements whose term is a NaN, the lowest lane's last one."""
    best = None
    for i in range(lo, hi):
        t = term(xs[i])
        if t is not None and (best is None or ((i - lo) % 8, -i) < best[0]):
            best = (((i - lo) % 8, -i), t)
    return None if best is None else best[1]


def square_term(v: float):
    return bits(v) | 0x00400000 if v != v else None


def positive_term(v: float):  # x * (1 - sign): -Inf * 0 is the default NaN
    return bits(v) | 0x00400000 if v != v else DEFAULT_NAN if v == float("-inf") else None


def negative_term(v: float):  # x * sign: +Inf * 0 is the default NaN
    return bits(v) | 0x00400000 if v != v else DEFAULT_NAN if v == float("inf") else None


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
            want = winner(xs, b * bs, min(len(xs), b * bs + bs), square_term)
            if want is not None:
                assert got[b] == want, f"bucket {b} of {bs}: norm 0x{got[b]:08x}, rule 0x{want:08x}"
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
                want = winner(xs, lo, hi, term)
                if want is not None and count:
                    assert got[2 * b + k] == want, \
                        f"block {b} of {bs}, mean {k}: 0x{got[2 * b + k]:08x}, rule 0x{want:08x}"
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
