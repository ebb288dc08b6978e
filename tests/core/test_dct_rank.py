"""`dct`'s positions as one rank per block among the C(block, k) subsets (csrc/common/fc_dct_rank.h):
the table (two words per entry) against math.comb, the ranks the encoder writes against a Python
colex rank (one-word and two-word ranks), any rank decoded to the subset Python unranks, the bytes
against the bound, the rule's edges (plain indices beyond it) and a rank >= C(block, k) refused."""
import math
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from fsdpcomp import _C
from helpers.dct_ref import dct_matrix

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = os.path.join(ROOT, "csrc", "common")


def ranked(B, k):
    """fc_dct_ranked's rule, written again: 1 <= k <= B / 2, k <= 32 and C(B, k) < 2^128 - 1."""
    return 1 <= k and 2 * k <= B and k <= 32 and math.comb(B, k) < 2**128 - 1


def rank_bits(B, k):
    return (math.comb(B, k) - 1).bit_length()


def colex_rank(pos):
    return sum(math.comb(c, j + 1) for j, c in enumerate(sorted(pos)))


def colex_unrank(r, k):
    out = []
    for j in range(k, 0, -1):
        c = j - 1
        while math.comb(c + 1, j) <= r:
            c += 1
        out.append(c)
        r -= math.comb(c, j)
    return sorted(out)


def index_bytes(nb, B, k):
    """Ranks, or log2(B)-bit indices, in groups of 8, padded to 4 bytes."""
    if ranked(B, k):
        raw = (nb + 7) // 8 * rank_bits(B, k)
    else:
        raw = (nb * k + 7) // 8 * int(math.log2(B))
    return (raw + 3) // 4 * 4


def rank_at(body, w, b):
    v = int.from_bytes(bytes(body.tolist()), "little")
    return (v >> (b * w)) & ((1 << w) - 1)


def set_rank(body, w, b, r):
    v = int.from_bytes(bytes(body.tolist()), "little")
    v = (v & ~(((1 << w) - 1) << (b * w))) | (r << (b * w))
    body[:] = torch.tensor(list(v.to_bytes(body.numel(), "little")), dtype=torch.uint8)


def test_the_table_is_the_generators_and_math_comb():
    out = subprocess.run([sys.executable, os.path.join(COMMON, "gen_binom_table.py")], capture_output=True,
                         text=True, check=True).stdout
    with open(os.path.join(COMMON, "fc_binom_table.h")) as f:
        assert f.read() == out
    words = [int(t, 16) for t in re.findall(r"0x[0-9a-f]+(?=ull)", out)]
    assert len(words) == 2 * 33 * 257  # {low word, high word} per entry
    nums = [lo + (hi << 64) for lo, hi in zip(words[0::2], words[1::2])]
    for j in range(33):
        for n in range(257):
            assert nums[j * 257 + n] == min(math.comb(n, j), 2**128 - 1), (n, j)
    # both words exercised: one-word entries, two-word ones and the saturated
    assert nums[12 * 257 + 128] < 2**64 <= nums[16 * 257 + 128] < 2**128 - 1 == nums[32 * 257 + 256]


def signal_of(subsets, B):
    """Blocks whose DCT has exactly the given supports (distinct magnitudes 8, 9, ...): the codec's
    pick of k is then that support."""
    C = dct_matrix(B)
    Y = torch.zeros(len(subsets), B, dtype=torch.float64)
    for b, pos in enumerate(subsets):
        for i, c in enumerate(pos):
            Y[b, c] = (8.0 + i) * (-1) ** i
    return (Y @ C).reshape(-1).float()


# every block size; k = 1, the largest ranked k, the first plain one, B - 1 and B; the last one-word
# ranks (15 of 128: 64 bits, 11 of 256), the first two-word ones (16 of 128: 67 bits, 12 of 256) and
# more of them, up to the rows' end (32 of 128: 101 bits) and 128 bits' (29 of 256: 127 bits)
EDGES = [(8, 1), (8, 4), (8, 5), (8, 7), (8, 8), (16, 8), (32, 16), (64, 1), (64, 32), (64, 33), (64, 63),
         (128, 1), (128, 12), (128, 15), (128, 16), (128, 17), (128, 24), (128, 32), (128, 33), (128, 127),
         (256, 1), (256, 11), (256, 12), (256, 16), (256, 29), (256, 30), (256, 255), (256, 256)]


@pytest.mark.parametrize("B,k", EDGES)
def test_random_subsets_round_trip_and_cost_the_bound(B, k):
    rng = random.Random(B * 1000 + k)
    nb = 11  # a partial group of 8 blocks
    subsets = [sorted(rng.sample(range(B), k)) for _ in range(nb)]
    subsets[0] = list(range(k))              # rank 0
    subsets[1] = list(range(B - k, B))       # rank C(B, k) - 1
    x = signal_of(subsets, B)
    s = _C.State("dct", {"block": B, "k": k, "quantize": "none"})
    n = x.numel()
    ib = index_bytes(nb, B, k)
    exact = _C.HEADER_BYTES + ib + 4 * nb * k  # fp32 values
    assert s.payload_bytes(n) == -(-exact // _C.ALIGN) * _C.ALIGN
    p = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
    w = s.compress(x, p)
    assert w == s.payload_bytes(n)
    body = p[_C.HEADER_BYTES:w]
    if ranked(B, k):
        rb = rank_bits(B, k)
        assert [rank_at(body[:ib], rb, b) for b in range(nb)] == [colex_rank(t) for t in subsets]
        assert rank_at(body[:ib], rb, 1) == math.comb(B, k) - 1
        assert body[(nb * rb + 7) // 8:ib].eq(0).all()  # the padding
    d = torch.zeros_like(x)
    s.decompress(p[:w], d)
    torch.testing.assert_close(d, x, atol=1e-4 * float(x.abs().max()), rtol=0)


@pytest.mark.parametrize("B,k", [(B, k) for B, k in EDGES if ranked(B, k)])
def test_any_rank_decodes_to_its_subset(B, k):
    # ranks written into a payload, decoded, the decode transformed back: the support is the
    # subset a Python colex unranking names
    rng = random.Random(B + k)
    nb = 9
    s = _C.State("dct", {"block": B, "k": k, "quantize": "none"})
    n = nb * B
    p = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
    w = s.compress(torch.randn(n), p)
    ib, rb = index_bytes(nb, B, k), rank_bits(B, k)
    top = math.comb(B, k)
    ranks = [0, top - 1] + [rng.randrange(top) for _ in range(nb - 2)]
    body = p[_C.HEADER_BYTES:w].clone()
    for b, r in enumerate(ranks):
        set_rank(body[:ib], rb, b, r)
    body[ib:ib + 4 * nb * k] = torch.arange(1, nb * k + 1, dtype=torch.float32).view(torch.uint8)  # no 0
    p[_C.HEADER_BYTES:w] = body
    d = torch.zeros(n)
    s.decompress(p[:w], d)
    Y = d.double().view(nb, B) @ dct_matrix(B).T
    for b, r in enumerate(ranks):
        support = (Y[b].abs() > 0.5).nonzero().flatten().tolist()
        assert support == colex_unrank(r, k), (b, r)


@pytest.mark.parametrize("B,k,bad", [(128, 12, "top"), (128, 12, "ones"), (64, 32, "top"), (8, 3, "ones"),
                                     (256, 11, "ones"), (128, 16, "top"), (128, 17, "ones"), (128, 32, "top"),
                                     (256, 29, "ones"), (256, 29, "top")])
def test_a_rank_beyond_the_subsets_is_refused(B, k, bad):
    # (8, 1) has none to corrupt: 3 bits hold exactly the 8 subsets
    nb = 5
    s = _C.State("dct", {"block": B, "k": k, "quantize": "none"})
    n = nb * B
    p = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
    w = s.compress(torch.randn(n), p)
    rb = rank_bits(B, k)
    r = math.comb(B, k) if bad == "top" else (1 << rb) - 1
    assert r >= math.comb(B, k)
    body = p[_C.HEADER_BYTES:w].clone()
    set_rank(body[:index_bytes(nb, B, k)], rb, 3, r)
    p[_C.HEADER_BYTES:w] = body
    msg = f"block 3's position rank {r} is not below C\\({B}, {k}\\)"
    with pytest.raises(_C.PayloadError, match=msg):
        s.decompress(p[:w], torch.zeros(n))


def test_the_rule_keeps_ranks_within_128_bits():
    for B in (4, 8, 16, 32, 64, 128, 256):
        for k in range(1, B + 1):
            if ranked(B, k):
                assert rank_bits(B, k) <= 128
    assert [max(k for k in range(1, B + 1) if ranked(B, k)) for B in (64, 128, 256)] == [32, 32, 29]
    # the rows, not the bits, stop B = 128: 33 of 128 would fit 102 bits
    assert rank_bits(128, 32) == 101 and (math.comb(128, 33) - 1).bit_length() == 102


def test_the_rule_is_the_payload_size():
    # fc_dct_ranked decides the size: every k of every block size against the rule written again
    n = 3 * 256 + 5  # partial blocks, a partial group of 8
    for B in (4, 8, 16, 32, 64, 128, 256):
        if B < 8:
            continue  # the key table's smallest block is 8
        for k in range(1, B + 1):
            s = _C.State("dct", {"block": B, "k": k, "quantize": "none"})
            nb = -(-n // B)
            exact = _C.HEADER_BYTES + index_bytes(nb, B, k) + 4 * nb * k
            assert s.payload_bytes(n) == -(-exact // _C.ALIGN) * _C.ALIGN, (B, k)


@pytest.mark.parametrize("B,k", [(128, 16), (128, 17), (128, 24), (128, 32), (256, 12), (256, 20), (256, 29)])
def test_two_word_ranks_of_random_gradients_are_the_colex_rank(B, k):
    # the encoder's own pick on a random block (not a planted support): its kept positions, read
    # back from the decode, rank as Python ranks them, and the bits past 64 are in use
    gen = torch.Generator().manual_seed(B * 100 + k)
    nb = 10
    x = torch.randn(nb * B, generator=gen)
    s = _C.State("dct", {"block": B, "k": k, "quantize": "none"})
    p = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, p)
    d = torch.zeros_like(x)
    s.decompress(p[:w], d)
    Y = d.double().view(nb, B) @ dct_matrix(B).T
    body = p[_C.HEADER_BYTES:w]
    ib, rb = index_bytes(nb, B, k), rank_bits(B, k)
    assert rb > 64
    ranks = [rank_at(body[:ib], rb, b) for b in range(nb)]
    for b in range(nb):
        support = (Y[b].abs() > 0.05).nonzero()  # kept: among the largest of B normals; else rounding.flatten().tolist()
        assert len(support) == k and ranks[b] == colex_rank(support), b
    assert max(ranks) >= 2**64
