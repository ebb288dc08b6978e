"""The CPU fast paths (vectorised, AVX2 clones) against the scalar reference loops, which are the
documented definitions the CUDA kernels reproduce: the same payload bytes and the same decoded
bits on adversarial inputs (subnormals, ties, values at the clamp, NaN, Inf, signed zeros, any
bit pattern) and on block and chunk sizes from tiny to huge."""
import contextlib

import pytest
import torch

from fsdpcomp import _C

# every quantiser whose encode or decode has a fast path, in the configurations that pick
# different code (formats, widths, rounding modes, block sizes at both ends)
CASES = [
    ("fp16", {}), ("bf16", {}),
    ("fp8", {"format": "e4m3"}), ("fp8", {"format": "e5m2", "block_size": 8}),
    ("int8", {}), ("int8", {"block_size": 8}), ("int8", {"stochastic": True}),
    # blocks of 1 and 4 Philox calls, and blocks spanning several 256-element stretches of
    # draws (test_rng.py covers every length of the batch's tail)
    ("int8", {"stochastic": True, "block_size": 8}), ("int8", {"stochastic": True, "block_size": 32}),
    ("int8", {"stochastic": True, "block_size": 1024}),
    ("intN", {"bits": 4}), ("intN", {"bits": 2, "block_size": 8}),
    ("intN", {"bits": 4, "stochastic": True}), ("intN", {"bits": 2, "stochastic": True}),
    ("intN", {"bits": 4, "stochastic": True, "block_size": 8}), ("intN", {"bits": 2, "block_size": 1024}),
    ("intN", {"bits": 3}), ("intN", {"bits": 3, "stochastic": True}), ("intN", {"bits": 3, "block_size": 8}),
    ("intN", {"bits": 3, "scheme": "minmax"}), ("intN", {"bits": 3, "scheme": "minmax", "stochastic": True}),
    ("intN", {"bits": 2, "scheme": "minmax", "block_size": 8}),
    ("intN", {"bits": 4, "scheme": "minmax", "stochastic": True, "block_size": 8}),
    ("nc", {}), ("nc", {"block_size": 8}), ("nc", {"block_size": 1024}),
    # code widths 2 (generic packer), 5 and 8 (specialised), 11 (wider than a byte: fc_pack8)
    ("qsgd", {}), ("qsgd", {"levels": 127}), ("qsgd", {"levels": 1, "bucket_size": 8}),
    ("qsgd", {"levels": 1000, "bucket_size": 1024}),
    # the decode's other literal widths: 3 (small buckets) and 7
    ("qsgd", {"levels": 3, "bucket_size": 8}), ("qsgd", {"levels": 40}),
    ("signsgd", {}), ("signsgd", {"mode": "majority"}), ("onebit", {}), ("onebit", {"block_size": 8}),
    ("onebit", {"block_size": 1024}),
]


@contextlib.contextmanager
def reference_kernels():
    prev = _C._reference_kernels(True)
    try:
        yield
    finally:
        _C._reference_kernels(prev)


def bits(t):
    return t.view(torch.int32)


def f32(pattern):
    return pattern.to(torch.int32).view(torch.float32)


def adversarial(gen):
    """Named inputs that reach every branch of the scalar definitions."""
    n = 4099  # not a multiple of 8, of any block size, or of a Philox batch
    g = torch.randn(n, generator=gen)
    ints = torch.randint(-127, 128, (n,), generator=gen).float()
    any_bits = torch.randint(-(1 << 31), 1 << 31, (n,), generator=gen, dtype=torch.int64)
    halfway = torch.arange(n, dtype=torch.float32) + 0.5  # ties at every integer scale
    f16_ties = 1.0 + (2 * torch.arange(n, dtype=torch.float32) + 1) * 2.0 ** -11
    sub16 = (torch.arange(n, dtype=torch.float32) - n // 2) * 2.0 ** -25  # fp16 subnormal ties
    cases = {
        "normal": g,
        "any_bits": f32(any_bits),  # NaN, Inf and subnormals scattered in every block
        "subnormal_f32": g * 1e-40,
        "tiny": g * 1e-30,
        "huge": g * 1e37,
        "int_ties": torch.where(torch.arange(n) % 2 == 0, ints, ints + 0.5) * (1 - 2 * (ints < 0)),
        "halfway": halfway * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0),
        "f16_ties": f16_ties * 1e-3,
        "f16_subnormal": sub16,
        "f16_overflow": torch.linspace(65000.0, 66000.0, n),
        "clamp": torch.where(torch.arange(n) % 3 == 0, torch.full((n,), 3.0), g.clamp(-3, 3)),
        "signed_zeros": torch.where(g < 0, torch.tensor(-0.0), torch.tensor(0.0)),
        "exp_range": torch.ldexp(g.sign() + 0.25, torch.randint(-149, 128, (n,), generator=gen)),
    }
    nan_block, inf_block = g.clone(), g.clone()
    nan_block[100] = float("nan")
    inf_block[300] = float("-inf")
    inf_block[3000] = float("inf")
    cases["nan_in_block"] = nan_block
    cases["inf_in_block"] = inf_block
    cases["zero_block"] = torch.cat([torch.zeros(512), g[512:]])
    return cases


def run_both(method, cfg, x, world, acc0):
    out = []
    for ref in (False, True):
        ctx = reference_kernels() if ref else contextlib.nullcontext()
        with ctx:
            s = _C.State(method, dict(cfg, error_feedback=False, seed=7))
            # a marked buffer, longer than the payload: a fast path writing past its body (a wide
            # store) differs from the reference there
            buf = torch.full((s.payload_bytes(x.numel()) + 64,), 0xAB, dtype=torch.uint8)
            w = s.compress(x, buf, chunk=1, world=world, rank=world - 1)
            acc = acc0.clone()
            s.decompress(buf[:w], acc, alpha=0.75, chunk=1, world=world)
            out.append((buf.clone(), acc))
    return out


@pytest.mark.parametrize("method,cfg", CASES, ids=lambda v: str(v) if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_fast_path_bytes_equal_reference(method, cfg, gen):
    assert _C._reference_kernels(False) is False  # the fast paths are the default
    inputs = adversarial(gen)
    for name, x in inputs.items():
        for world in (1, 3):
            acc0 = torch.randn(x.numel(), generator=gen)
            (fast, dfast), (ref, dref) = run_both(method, cfg, x.contiguous(), world, acc0)
            assert torch.equal(fast, ref), f"{method} {cfg} {name} world={world}: payload bytes differ"
            assert torch.equal(bits(dfast), bits(dref)), f"{method} {cfg} {name}: decode differs"


# 3276 = 2 * 1638: per chunk, 3 whole qsgd buckets of 512 and a short one (the four-bucket
# norm step falls back to one at a time)
@pytest.mark.parametrize("n", [1, 7, 8, 63, 64, 65, 257, 3276, 4099, 1 << 16])
@pytest.mark.parametrize("method,cfg", [("fp16", {}), ("fp8", {"block_size": 1 << 16}),
                                        ("int8", {"block_size": 1 << 16, "stochastic": True}),
                                        ("int8", {"stochastic": True}),
                                        ("intN", {"bits": 2}), ("intN", {"bits": 4, "block_size": 8}),
                                        ("intN", {"bits": 3, "block_size": 8}),
                                        ("intN", {"bits": 3, "scheme": "minmax", "stochastic": True}),
                                        ("intN", {"bits": 4, "stochastic": True, "block_size": 1 << 16}),
                                        ("nc", {"block_size": 1 << 16}), ("nc", {}),
                                        ("qsgd", {}), ("qsgd", {"levels": 127, "bucket_size": 8}),
                                        ("qsgd", {"levels": 1, "bucket_size": 8}),
                                        ("qsgd", {"levels": 1000}), ("qsgd", {"levels": 40}),
                                        ("signsgd", {}), ("onebit", {}), ("onebit", {"block_size": 8})])
def test_fast_path_sizes(method, cfg, n, gen):
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 8
    acc0 = torch.randn(n, generator=gen)
    (fast, dfast), (ref, dref) = run_both(method, cfg, x, 2, acc0)
    assert torch.equal(fast, ref)
    assert torch.equal(bits(dfast), bits(dref))


def decode_corrupted(method, cfg, buf, acc0):
    """Decode `buf` on both paths: the same error (or none) and the same accumulator."""
    out = []
    for ref in (False, True):
        with reference_kernels() if ref else contextlib.nullcontext():
            s = _C.State(method, dict(cfg, error_feedback=False, seed=7))
            acc = acc0.clone()
            try:
                s.decompress(buf, acc, alpha=0.75, chunk=0, world=1)
                err = None
            except _C.PayloadError as e:
                err = str(e)
            out.append((err, acc))
    (e_fast, a_fast), (e_ref, a_ref) = out
    assert e_fast == e_ref
    assert torch.equal(bits(a_fast), bits(a_ref))
    return e_ref


# decoders that check each code: any byte after the header and the block metadata, in a block
# near the end so that earlier blocks are accumulated before the error
@pytest.mark.parametrize("method,cfg,meta", [
    ("nc", {}, lambda n: 4 * -(-n // 256)), ("nc", {"block_size": 8}, lambda n: 4 * -(-n // 8)),
    ("qsgd", {"levels": 10}, lambda n: 4 * -(-n // 512)),
    ("qsgd", {"levels": 1000, "bucket_size": 8}, lambda n: 4 * -(-n // 8)),
    ("qsgd", {"levels": 2, "bucket_size": 8}, lambda n: 4 * -(-n // 8))])
@pytest.mark.parametrize("n", [4099, 4096])
def test_fast_decode_of_corrupted_codes_equals_reference(method, cfg, meta, n, gen):
    # nc: small values, so that random exponent codes fall above the blocks' range
    x = torch.randn(n, generator=gen) * (1e-30 if method == "nc" else 1.0)
    s = _C.State(method, dict(cfg, error_feedback=False, seed=7))
    buf = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
    w = s.compress(x, buf, chunk=0, world=1, rank=0)
    buf = buf[:w]
    acc0 = torch.randn(n, generator=gen)
    assert decode_corrupted(method, cfg, buf, acc0) is None
    start = _C.HEADER_BYTES + meta(n)
    errors = 0
    for _ in range(20):
        bad = buf.clone()
        pos = torch.randint(start + (w - start) * 3 // 4, w, (8,), generator=gen)
        bad[pos] = torch.randint(0, 256, (8,), generator=gen, dtype=torch.uint8)
        errors += decode_corrupted(method, cfg, bad, acc0) is not None
    if method == "nc":  # a block's metadata: an exponent above 255, or 255 (NaN block)
        for word in (256, 255, 0):
            bad = buf.clone()
            bad[_C.HEADER_BYTES + 4:_C.HEADER_BYTES + 8] = torch.tensor([word], dtype=torch.int32).view(torch.uint8)
            decode_corrupted(method, cfg, bad, acc0)
        bad = buf.clone()
        bad[start + n - 5] = 0x80  # the signed zero code, which no encoder writes
        assert decode_corrupted(method, cfg, bad, acc0) is not None
    assert errors > 0  # the corruptions reached the code checks


def test_reference_switch_takes_a_truth_value():
    with pytest.raises(TypeError):
        _C._reference_kernels(FailingBool())
    assert _C._reference_kernels(False) is False


class FailingBool:
    def __bool__(self):
        raise TypeError("no truth value")
