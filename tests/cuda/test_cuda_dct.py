"""`dct` (csrc/methods/m_dct.c, cuda/fc_cu_dct.cu) and the `ef_decay` key through the CUDA library against
the CPU reference, bit for bit: dct's block sizes, k and value codecs beyond
tests/helpers/method_cases.py's (which tests/cuda/test_cuda_sparse.py and test_cuda_single.py run),
the payloads the CPU refuses, and error feedback with a decaying residual (g' = g + ef_decay * e,
the float product on both sides) for dense, sparse and transform methods.

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import check_decode, check_encode, cpu_encode, make_grad, same_bits
from helpers.cuda_device import DEV, OnDevice, on_device, skip_without_device

skip_without_device()

BACKEND = OnDevice()

# the smallest and largest blocks, k = block (every coefficient), k = 1, each value codec, and
# positions as ranks and as plain indices;
# fp32 values at half of each block of 8: three senders often keep one coefficient, and their sum
# shows the rank order (fp16's values sum exactly in fp32 in any order)
DCT = [
    ("dct", {"block": 8, "k": 8}), ("dct", {"block": 8, "k": 1, "quantize": "int8"}),
    ("dct", {"block": 8, "k": 4, "quantize": "none"}),
    ("dct", {"block": 256, "k": 5, "quantize": "qsgd"}), ("dct", {"block": 16, "k": 3, "quantize": "nc"}),
    ("dct", {"block": 128, "k": 7, "quantize": "intN"}), ("dct", {"block": 64, "k": 2, "quantize": "fp16"}),
    # the index coding's edges (csrc/common/fc_dct_rank.h): B = 64's widest rank (61 bits), the
    # widest one-word rank (64 bits), two-word ranks (70 bits; 127, the widest), plain indices past
    # 128 bits, past the table's rows (33 of 128) and past block / 2 (k = 8 of 8 above is one too)
    ("dct", {"block": 64, "k": 32, "quantize": "none"}), ("dct", {"block": 128, "k": 15, "quantize": "none"}),
    ("dct", {"block": 128, "k": 17, "quantize": "intN", "value_bits": 3}),
    ("dct", {"block": 256, "k": 29, "quantize": "none"}), ("dct", {"block": 256, "k": 30, "quantize": "none"}),
    ("dct", {"block": 128, "k": 33, "quantize": "fp16"}), ("dct", {"block": 32, "k": 17, "quantize": "int8"}),
]
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in DCT]


@pytest.mark.parametrize("method,cfg", DCT, ids=IDS)
def test_dct_encode_matches_cpu(method, cfg, gen):
    """Payload bytes and residuals (fp32, bf16) over steps, chunks that end inside a block (the
    zero padding) and chunks shorter than one block."""
    for world, rank, n in ((1, 0, 1), (1, 0, 1031), (3, 1, 257), (4, 3, 2053)):
        check_encode(BACKEND, method, cfg, torch.float32, world, rank, n, gen)
    check_encode(BACKEND, method, cfg, torch.bfloat16, 3, 2, 1031, gen, residual_dtype="bf16")
    check_encode(BACKEND, method, cfg, torch.float32, 3, 0, 1031, gen, nonfinite="pass")


@pytest.mark.parametrize("method,cfg", DCT, ids=IDS)
def test_dct_decode_matches_cpu(method, cfg, gen):
    """W payloads summed in the coefficient domain and inverted once per block, with the own
    chunk in rank order, as the CPU's aggregate and decode_agg; a chunk shorter than a block."""
    check_decode(BACKEND, method, cfg, torch.float32, 4, 2, 2053, gen)
    check_decode(BACKEND, method, cfg, torch.bfloat16, 3, 0, 1031, gen, nonfinite=True, compress_own=True)
    check_decode(BACKEND, method, cfg, torch.float32, 5, 4, 12, gen)


def test_dct_ties_and_zero_blocks_match_cpu(gen):
    """Blocks of zeros (every coefficient tied: the lowest indices go) and of one repeated value
    (all the energy in coefficient 0), next to random ones."""
    g = make_grad(64 * 6, torch.float32, gen)
    g[:64] = 0.0
    g[128:192] = 1.5
    g[256:320] = -0.0
    for cfg in ({}, {"block": 32, "k": 4, "quantize": "none"}):
        full = dict(cfg, seed=3, error_feedback=True, compress_own_chunk=True)
        cpu, dev = fsdpcomp.CommState("dct", full), on_device("dct", full)
        for _ in range(2):
            a = cpu_encode(cpu, g, 1, 0, cpu._core.begin(g.numel()))
            assert torch.equal(a, BACKEND.encode(dev, g, 1, 0)), f"{cfg}: payload bytes differ"
            cpu.end_step()
            dev.end_step()


def corrupt_decode(cfg: dict, n: int, edit) -> None:
    """A CPU payload for one rank, edited so that the CPU raises PayloadError: on the device the
    output is NaN and the error comes when counters are read."""
    full = dict(cfg, seed=5, compress_own_chunk=True, pipeline=False)
    st = fsdpcomp.CommState("dct", full)
    g = make_grad(n, torch.float32, gen=torch.Generator().manual_seed(1))
    send = cpu_encode(st, g, 1, 0, st._core.begin(n))
    edit(send)
    with pytest.raises(fsdpcomp.PayloadError):
        st._core.decode(send, g, torch.empty(n), 1, 0, 0)
    dev = on_device("dct", full)
    out = torch.zeros(n, device=DEV)
    dev._core.decode(send.to(DEV, copy=True), g.to(DEV, copy=True), out, 1, 0, dev._core.begin(n))
    with pytest.raises(fsdpcomp.PayloadError, match="rank 0"):
        dev.counters()
    assert torch.isnan(out.cpu()).all()


def test_dct_payloads_that_the_cpu_rejects_are_rejected():
    # block 0's 55-bit rank all ones: not below C(128, 12) ~ 2^54.4
    corrupt_decode({}, 1000, lambda p: p.__setitem__(slice(32, 39), 0xFF))
    # two-word ranks: block 0's 70-bit rank all ones, then its high word that of C(128, 17) =
    # 0x21_565d5ccf40dcac80 with the low word all ones (the words compared low after high)
    k17 = {"block": 128, "k": 17, "quantize": "none"}
    corrupt_decode(k17, 1000, lambda p: p.__setitem__(slice(32, 41), 0xFF))
    corrupt_decode(k17, 1000, lambda p: (p.__setitem__(slice(32, 40), 0xFF), p.__setitem__(40, 0x21)))
    # plain indices (k > block / 2): the first group of 6-bit indices zeroed, block 0's second
    # index is not above its first
    corrupt_decode({"block": 64, "k": 40, "quantize": "none"}, 1000, lambda p: p.__setitem__(slice(32, 38), 0))
    # a value code no encoder writes (intN's default 4-bit codes stop at 14): 1000 elements keep
    # 8 blocks of 12 coefficients, 56 bytes of ranks (8 of 55 bits)
    corrupt_decode({"quantize": "intN"}, 1000, lambda p: p.__setitem__(32 + 56 + 4, 0xFF))


# ---- ef_decay: the cast, block-codec (tile), sparse and transform kernels' loads of g'
DECAY = [("bf16", {}), ("int8", {}), ("onebit", {}), ("topk", {"ratio": 0.1}), ("dct", {}),
         ("dct", {"block": 32, "k": 3, "quantize": "intN", "value_bits": 3})]
DECAY_IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in DECAY]


@pytest.mark.parametrize("method,cfg", DECAY, ids=DECAY_IDS)
def test_decayed_residual_matches_cpu(method, cfg, gen):
    """ef_decay = 0.9 over 3 steps of error feedback: payload bytes and residuals (fp32, bf16,
    int8) the CPU's; NaN/Inf in "zero" mode (g' = 0.9 e there) and near fp32's largest value."""
    c = dict(cfg, ef_decay=0.9)
    for res in ("fp32", "bf16", "int8"):
        check_encode(BACKEND, method, c, torch.float32, 3, 1, 1031, gen, residual_dtype=res, steps=3)
    check_encode(BACKEND, method, c, torch.bfloat16, 1, 0, 257, gen, steps=3)
    check_encode(BACKEND, method, c, torch.float32, 3, 2, 1031, gen, nonfinite="zero", steps=3)
    check_encode(BACKEND, method, c, torch.float32, 3, 1, 1031, gen, huge=True, steps=3)


@pytest.mark.parametrize("method,cfg", [("int8", {}), ("dct", {})], ids=["int8", "dct"])
def test_decay_changes_the_payload(method, cfg, gen):
    """The key takes effect on the device: from the second step (a residual to decay) the
    payloads of 0.9 and of 1 differ, each equal to the CPU's."""
    g = [make_grad(1031, torch.float32, gen) for _ in range(2)]
    sent = {}
    for d in (0.9, 1.0):
        full = dict(cfg, seed=3, error_feedback=True, ef_decay=d, compress_own_chunk=True, pipeline=False)
        cpu, dev = fsdpcomp.CommState(method, full), on_device(method, full)
        for x in g:
            a = cpu_encode(cpu, x, 1, 0, cpu._core.begin(x.numel()))
            b = BACKEND.encode(dev, x, 1, 0)
            assert torch.equal(a, b), f"{method} ef_decay={d}: payload bytes differ"
            cpu.end_step()
            dev.end_step()
        sent[d] = b
    assert not torch.equal(sent[0.9], sent[1.0])


@pytest.mark.parametrize("method,cfg", [("int8", {}), ("dct", {}), ("dct", {"block": 16, "k": 2, "quantize": "int8"})],
                         ids=["int8", "dct", "dct-16-int8"])
def test_single_payloads_with_a_decayed_residual_match_cpu(method, cfg, gen):
    """compress(residual=e) with ef_decay: g' = x + 0.9 e, its payload and e replaced, the CPU's
    bytes and bits; one step with NaN/Inf."""
    c = dict(cfg, seed=99, ef_decay=0.9)
    cpu, dev = fsdpcomp.CommState(method, c), on_device(method, c)
    n = 1031
    ea, eb = torch.zeros(n), torch.zeros(n, device=DEV)
    for step, bad in enumerate((False, False, True)):
        x = make_grad(n, torch.float32, gen, nonfinite=bad)
        size = cpu._core.payload_bytes(n)
        pa = torch.zeros(size, dtype=torch.uint8)
        pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
        wa = cpu._core.compress(x, pa, unit=2, chunk=4, world=3, rank=1, residual=ea)
        wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=2, chunk=4, world=3, rank=1, residual=eb)
        assert wa == wb and torch.equal(pa[:wa], pb[:wb].cpu()), f"{method} step {step}: payloads differ"
        assert same_bits(ea, eb.cpu()), f"{method} step {step}: residuals differ"
        cpu.end_step()
        dev.end_step()
