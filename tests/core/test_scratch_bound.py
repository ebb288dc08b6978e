"""The C core's scratch (counters()["scratch_bytes"]) holds at most 8 bytes per element of the
largest chunk, for every method (issue 38 item 6): the fp32 working copy g' of the chunk being
encoded (4 B), which a decode reuses for a compressed-domain sum, and the method's own scratch
sized by the chunk and its k (topk: k indices and values; thresholdv: the kept values). An fp32
output is summed in place, so no accumulator is held; a bf16 output's sum runs in the working
copy, the compressed-domain sum beside it (small) or decoded over itself (dct, sketch). An
8-bit residual is read and packed in place (no unit-sized fp32 copy), a block of 64 that a chunk
boundary cuts staged meanwhile. W = 2 and 4 run through wire_sim (the collective's C calls in
one process); W = 1 through reduce_scatter, the per-peer path."""
import pytest
import torch

import fsdpcomp
from helpers import wire_sim
from helpers.method_cases import CASES, case_id

N = 16609  # issue 38's FSDP1 unit: an odd size, so the last chunk is the shorter one
# What is held beyond 8 B per element: each buffer rounded up to 64 bytes and the method
# scratch's own 64-byte pad (at most 4 x 64), and a second round's k picks (sketch: 4 x 64).
ALLOWANCE = 512
# An 8-bit residual's carry: the whole encode stages one cut block at a time (64 fp32 values and
# their block's index, rounded up to 64 bytes); the per-peer parts one per cut block, none here.
CARRY = 320
INT8 = {"residual_dtype": "int8"}


def _per(n, world):
    return -(-n // world)


def _worst_scratch(method, cfg, world, dtype=torch.float32):
    """Two steps of W ranks (the first call takes the error sample, error_stats_every: its decode
    too); the largest scratch_bytes of the W."""
    states = [fsdpcomp.CommState(method, cfg) for _ in range(world)]
    g = torch.Generator().manual_seed(7)
    grads = [torch.randn(N, generator=g).to(dtype) for _ in range(world)]
    outs = [torch.empty(_per(N, world), dtype=dtype) for _ in range(world)]
    for _ in range(2):
        wire_sim.exchange(states, grads, outs)
        wire_sim.end_step(states)
    return max(s.counters()["scratch_bytes"] for s in states)


def _check(got, world, extra=0):
    per = _per(N, world)
    assert got <= 8 * per + ALLOWANCE + extra, f"{got} bytes, {got / per:.2f} B per element of the chunk"


@pytest.mark.parametrize("ef", [True, False], ids=["ef", "no-ef"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_scratch_is_at_most_8_bytes_per_element_of_the_largest_chunk(case, ef):
    method, cfg = case
    _check(_worst_scratch(method, dict(cfg, error_feedback=ef), 2), 2)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_an_int8_residual_keeps_the_bound(case, world):
    """Was 4 W B per chunk element more: the unit's residual unpacked into an fp32 workspace."""
    method, cfg = case
    _check(_worst_scratch(method, dict(cfg, error_feedback=True, **INT8), world), world, CARRY)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("ef", [True, False], ids=["ef", "no-ef"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_bf16_grads_and_outputs_keep_the_bound(case, ef, world):
    """Was up to 12 B: an fp32 accumulator beside the working copy for a compressed-domain sum,
    and the sampled error's decode beside a bf16 gradient's fp32 copy."""
    method, cfg = case
    _check(_worst_scratch(method, dict(cfg, error_feedback=ef), world, torch.bfloat16), world)


@pytest.mark.parametrize("extra", [{}, INT8], ids=["fp32", "int8"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_per_peer_reduce_scatter_keeps_the_bound(case, extra):
    method, cfg = case
    state = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True, pipeline_piece=4096, **extra))
    g = torch.Generator().manual_seed(8)
    for n in (N, 5000):  # a smaller unit after the largest: nothing regrows
        state.reduce_scatter(torch.randn(n, generator=g), torch.empty(n))
    state.end_step()
    got = state.counters()["scratch_bytes"]
    assert got <= 8 * N + ALLOWANCE, f"{got} bytes, {got / N:.2f} B per element of the chunk"


def test_a_call_between_decode_parts_closes_the_open_one_and_says_so():
    """decode_part's running sum lives in the scratch an encode uses: an encode on the same state
    between a unit's parts closes that call, and its next part is refused with the reason (the
    collective never interleaves them: every encode of a unit comes before its decodes)."""
    g = torch.Generator().manual_seed(9)
    grads = [torch.randn(64, generator=g), torch.randn(64, generator=g)]
    sender, s = fsdpcomp.CommState("int8"), fsdpcomp.CommState("int8")
    unit = s._core.begin(64)
    sender._core.begin(64)
    sends, _ = sender._core.plan(grads[1], 2, 1)
    buf = torch.empty(sum(sends), dtype=torch.uint8)
    sender._core.encode(grads[1], buf, 2, 1, unit)
    out = torch.empty(32)
    s._core.decode_part(torch.empty(0, dtype=torch.uint8), grads[0], out, 2, 0, unit, 0, 0)
    mine, _ = s._core.plan(grads[0], 2, 0)
    s._core.encode(grads[0], torch.empty(sum(mine), dtype=torch.uint8), 2, 0, unit)
    with pytest.raises(Exception, match="took its running sum"):
        s._core.decode_part(buf[:sends[0]], grads[0], out, 2, 0, unit, 1, 0)


@pytest.mark.parametrize("case", [("signsgd", {"mode": "majority"}), ("dct", {}), ("topk", {"ratio": 0.05}),
                                  ("randomk", {"ratio": 0.1})], ids=case_id)
def test_an_fp32_output_summed_in_place_is_the_bf16_outputs_sum(case):
    """The decode sums in the scratch, or (a compressed-domain sum: signsgd majority, dct, randomk)
    in an fp32 output in place, while a bf16 output takes an fp32 accumulator: the same sum, so
    the bf16 output is the fp32 one rounded, element for element."""
    method, cfg = case
    world = 2
    g = torch.Generator().manual_seed(10)
    grads = [torch.randn(4096, generator=g).to(torch.bfloat16) for _ in range(world)]
    outs = {}
    for odt in (torch.float32, torch.bfloat16):
        states = [fsdpcomp.CommState(method, dict(cfg, error_feedback=False)) for _ in range(world)]
        outs[odt] = [torch.empty(2048, dtype=odt) for _ in range(world)]
        wire_sim.exchange(states, [x.to(odt) for x in grads], outs[odt])
    for a, b in zip(outs[torch.float32], outs[torch.bfloat16]):
        assert torch.equal(a.to(torch.bfloat16), b)
