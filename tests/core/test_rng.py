"""The stochastic-rounding draws against an independent definition written here in Python:
Philox-4x32-10 (checked on the Random123 known-answer vectors), keyed by (seed, rank) with
counter (call, chunk, unit, step), 16 bits per element (element i: half i & 1 of word
(i >> 1) & 3 of call i >> 3), and int8's stochastic codes built from them in torch fp32. The C
fast path (AVX2 or SSE2 Philox batches) and the scalar reference must both give these bytes."""
import contextlib
import struct

import pytest
import torch

from fsdpcomp import _C

M32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("ctr,key,expect", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_python_philox_matches_random123_vectors(ctr, key, expect):
    assert philox4x32_10(ctr, key) == expect


def draws16(n, seed, rank, chunk, unit, step):
    key = (seed & M32, ((seed >> 32) ^ (0x85EBCA6B * (rank + 1))) & M32)
    out = []
    for call in range((n + 7) // 8):
        words = philox4x32_10((call, chunk, unit, step), key)
        for k in range(8):
            out.append((words[k >> 1] >> (16 * (k & 1))) & 0xFFFF)
    return torch.tensor(out[:n], dtype=torch.int64)


def int8_stochastic_body(x, h, bs):
    """scales (fp32) then codes: q = floor(x * (127 / amax) + h * 2^-16), clamped to +-127."""
    scales, codes = [], []
    u = h.to(torch.float32) * 2.0 ** -16
    for lo in range(0, x.numel(), bs):
        xb, ub = x[lo:lo + bs], u[lo:lo + bs]
        amax = xb.abs().max()
        scales.append(amax / 127.0)
        inv = torch.tensor(127.0, dtype=torch.float32) / amax
        codes.append(torch.floor(xb * inv + ub).clamp(-127, 127).to(torch.int8))
    return torch.stack(scales).view(torch.uint8), torch.cat(codes).view(torch.uint8)


@contextlib.contextmanager
def kernels(reference):
    prev = _C._reference_kernels(reference)
    try:
        yield
    finally:
        _C._reference_kernels(prev)


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("n,bs", [(1000, 256), (4099, 32), (333, 8), (2048, 2048)])
def test_int8_stochastic_bytes_follow_the_16_bit_definition(n, bs, reference, gen):
    seed, unit, chunk, world, rank = (1 << 40) + 12345, 3, 1, 3, 2
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen)
    with kernels(reference):
        s = _C.State("int8", {"stochastic": True, "block_size": bs, "seed": seed,
                              "error_feedback": False})
        buf = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
        s.compress(x, buf, unit=unit, chunk=chunk, world=world, rank=rank)
    version, = struct.unpack_from("<B", bytes(buf[2:3].tolist()))
    assert version == _C.WIRE_VERSION == 3  # 3: the fingerprint, world and flags in the header; the draws are version 2's
    h = draws16(n, seed, rank, chunk, unit, 0)
    scales, codes = int8_stochastic_body(x, h, bs)
    body = buf[_C.HEADER_BYTES:_C.HEADER_BYTES + scales.numel() + codes.numel()]
    assert torch.equal(body[:scales.numel()], scales)
    assert torch.equal(body[scales.numel():], codes)


def test_draws_use_all_16_bits_and_both_halves(gen):
    """A check on the Python definition itself, so that the test above cannot pass with a
    mapping that repeats draws: the halves and words of one call are distinct numbers."""
    h = draws16(4096, 7, 0, 1, 0, 0)
    assert h.max() > 0xF000 and h.min() < 0x1000
    assert torch.unique(h).numel() > 3500  # 4096 draws of 65536 values: few collisions
    assert (h.float().mean() / 65536 - 0.5).abs() < 0.02


def test_every_batch_tail_matches_the_scalar_definition(gen):
    """Chunks of 1..40 Philox calls (and one element short of whole calls): the batch's 32-,
    16-, 8- and 4-call steps and the one-call remainder each meet the scalar definition."""
    for calls in range(1, 41):
        for n in (8 * calls, 8 * calls - 3):
            x = torch.randn(n, generator=gen)
            out = []
            for reference in (False, True):
                with kernels(reference):
                    s = _C.State("int8", {"stochastic": True, "block_size": 1024, "seed": calls,
                                          "error_feedback": False})
                    buf = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
                    s.compress(x, buf, chunk=2, world=3, rank=1)
                    out.append(buf)
            assert torch.equal(out[0], out[1]), f"{n} elements ({calls} calls)"
