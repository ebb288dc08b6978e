"""The hook's contract on real gloo ranks: output fully written, equal to reduce_scatter / W,
padding, per-unit residuals, every gradient dtype."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _grads(world, numel, dtype, seed):
    """Every rank's gradient, generated identically on all ranks so each can check the sum."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(numel, generator=g) * 2).to(dtype) for _ in range(world)]


def _ordered_mean(grads, rank, world, pipeline):
    """Sequential fp32 sum, then / W: the reference the C side must hit exactly. The one-shot
    exchange sums in rank order; the pipelined one (the default) in the order its payloads
    arrive: the own chunk, then rank+1, rank+2, ... (mod W)."""
    shard = grads[0].numel() // world
    order = [(rank + k) % world for k in range(world)] if pipeline else range(world)
    acc = torch.zeros(shard)
    for src in order:
        acc = acc + grads[src][rank * shard:(rank + 1) * shard].float()
    return acc / world


def _sharded(rank, world, method, dtype_name, seed, pipeline=True):
    dtype = DTYPES[dtype_name]
    shard = 1037  # odd, so chunks are not block multiples
    grads = _grads(world, world * shard, dtype, seed)
    cfg = {"block_size": 64} if method == "int8" else {}
    state = fsdpcomp.CommState(method, dict(cfg, pipeline=pipeline))
    out = torch.full((shard,), float("nan"), dtype=dtype)  # poisoned: every element must be written
    fsdpcomp.fsdp_hook(state, grads[rank].clone(), out)
    ref = _ordered_mean(grads, rank, world, pipeline)
    return out.float(), ref.to(dtype).float(), state.counters()


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("world", [2, 3])
def test_none_equals_reduce_scatter_mean_exactly(world, pipeline):
    for dtype_name in DTYPES:
        for rank, (out, ref, c) in enumerate(run_ranks(_sharded, world, "none", dtype_name, 5, pipeline)):
            assert not torch.isnan(out).any(), "output element left unwritten"
            assert torch.equal(out, ref), f"rank {rank} {dtype_name}"
            assert c["bytes_raw"] == c["bytes_sent"] - c["header_bytes"]


def test_int8_is_close_and_counts_bytes():
    world = 2
    for dtype_name in ("float32", "bfloat16"):
        for rank, (out, ref, c) in enumerate(run_ranks(_sharded, world, "int8", dtype_name, 9)):
            assert not torch.isnan(out).any()
            # each rank's payload is off by at most half a step of its block: amax/254 per rank
            bound = 8.0 / 254 + (0.02 if dtype_name == "bfloat16" else 0)
            assert (out - ref).abs().max() < bound
            elem = 4 if dtype_name == "float32" else 2
            assert c["bytes_raw"] == 1037 * elem
            nb = -(-1037 // 64)
            payload = -(-(_C.HEADER_BYTES + 1037 + 4 * nb) // 16) * 16
            # and the ranks' handshake: an 8-byte digest to each peer (counted as header bytes)
            assert c["bytes_sent"] == payload + 8 * (world - 1)
            assert c["header_bytes"] == payload - 1037 - 4 * nb + 8 * (world - 1)
            assert c["meta_bytes"] == 4 * nb and c["value_bytes"] == 1037


def _all_reduce(rank, world, method, numel, config=None, steps=1):
    state = fsdpcomp.CommState(method, config)
    for step in range(steps):
        grads = _grads(world, numel, torch.float32, 3 + step)
        g = grads[rank].clone()
        fsdpcomp.fsdp_hook(state, g)  # NO_SHARD signature: all-reduce meaning, in place
        state.end_step()
    return g, torch.stack(grads).sum(0) / world, state.counters()


@pytest.mark.parametrize("world", [2, 3])
def test_no_shard_all_reduce_with_padding(world):
    numel = 1000 * world + 1  # not divisible: the last chunk is shorter
    for g, ref, _ in run_ranks(_all_reduce, world, "none", numel):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-6)
    results = run_ranks(_all_reduce, world, "int8", numel)
    assert torch.equal(results[0][0], results[1][0]), "ranks must agree after an all-reduce"
    for g, ref, _ in results:
        assert (g - ref).abs().max() < 0.1


@pytest.mark.parametrize("world", [2, 3])
def test_compressed_all_gather_keeps_replicas_identical(world):
    """allgather_compress: the all-gather half is int8 too; every rank uses the decoded shards,
    so all replicas hold the same bits, and the bytes drop to about a quarter."""
    numel = 4096 * world + 5
    cfg = {"allgather_compress": True, "error_feedback": True, "block_size": 64}
    results = run_ranks(_all_reduce, world, "int8", numel, cfg, 3)
    for g, ref, c in results:
        assert torch.equal(g, results[0][0]), "replicas must be bit-identical"
        # two int8 roundings of values ~N(0, 4/W): well under one step of a 64-block each
        assert (g - ref).abs().max() < 0.25
        assert c["ratio"] > 3.5, c["ratio"]  # vs ~1.6 with the uncompressed all-gather
    plain = run_ranks(_all_reduce, world, "int8", numel, {"block_size": 64, "allgather_compress": False},
                      3)[0][2]
    assert plain["ratio"] < 2.0  # the opt-out: the reduced shards go back in fp32


def test_residuals_are_kept_per_unit_even_for_equal_sizes(gen):
    """Two units of the same size in one step must not share a residual."""
    state = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True, "block_size": 16})
    a, b = torch.randn(256, generator=gen), torch.randn(256, generator=gen) * 100
    out = torch.empty(256)
    fsdpcomp.fsdp_hook(state, a, out)
    fsdpcomp.fsdp_hook(state, b, out)
    state.end_step()
    ra, rb = own(state.state_dict()).residuals["scatter"]
    assert ra.abs().max() < a.abs().max() / 127  # a's residual is on a's scale
    assert rb.abs().max() > ra.abs().max() * 10  # b's is on b's scale
    # the next step adds each unit's own residual: g' == decode + e_new, unit by unit
    fsdpcomp.fsdp_hook(state, a, out)
    assert own(state.state_dict()).residuals["scatter"][0].abs().max() < a.abs().max() / 127


def test_error_feedback_invariant(gen):
    """g + e_old == decode(encode(g + e_old)) + e_new, elementwise (to fp32 rounding)."""
    state = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True, "block_size": 32})
    out = torch.empty(500)
    fsdpcomp.fsdp_hook(state, torch.randn(500, generator=gen), out)
    state.end_step()
    e_old = own(state.state_dict()).residuals["scatter"][0]
    g = torch.randn(500, generator=gen)
    fsdpcomp.fsdp_hook(state, g, out)  # world 1: out == decode(encode(g + e_old))
    e_new = own(state.state_dict()).residuals["scatter"][0]
    torch.testing.assert_close(out + e_new, g + e_old, rtol=0, atol=1e-6)


def test_unit_order_mismatch_is_reported(gen):
    state = fsdpcomp.CommState("int8")
    out = torch.empty(100)
    fsdpcomp.fsdp_hook(state, torch.randn(100, generator=gen), out)
    state.end_step()
    with pytest.raises(ValueError, match="200 elements but unit 0 had 100.*call order"):
        fsdpcomp.fsdp_hook(state, torch.randn(200, generator=gen), torch.empty(200))


def test_state_dict_round_trip(gen):
    cfg = {"error_feedback": True, "compress_own_chunk": True}
    a = fsdpcomp.CommState("int8", cfg)
    out = torch.empty(300)
    g = torch.randn(300, generator=gen)
    fsdpcomp.fsdp_hook(a, g, out)
    a.end_step()
    b = fsdpcomp.CommState("int8", cfg)
    b.load_state_dict(a.state_dict())
    assert b.step == a.step
    out_a, out_b = torch.empty(300), torch.empty(300)
    fsdpcomp.fsdp_hook(a, g, out_a)
    fsdpcomp.fsdp_hook(b, g, out_b)
    assert torch.equal(out_a, out_b)
    with pytest.raises(ValueError, match="method"):
        fsdpcomp.CommState("none").load_state_dict(a.state_dict())
