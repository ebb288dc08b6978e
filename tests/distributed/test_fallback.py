"""No payload ever goes out larger than `none`'s: a unit whose chunks a method cannot shrink (a
set sketch table larger than the chunk, scales and headers on a few elements) goes as `none`,
decided from sizes alone so every rank agrees; a data-dependent payload (thresholdv with most
values passing) falls back per payload, the header telling the receiver. Counted in
fallback_units. On a small model every method compresses at its defaults."""
import pytest
import torch
import torch.nn as nn

import fsdpcomp
from fsdpcomp import _C
from helpers.dist_utils import run_ranks
from helpers.method_cases import CASES, compressing_codecs
from helpers.tiny_models import TinyLM

SIZES = (1, 2, 3, 5, 8, 17, 100, 255, 1000, 4097, 20001, 70001)
DTYPES = (torch.float32, torch.bfloat16)
ALL = [(m, {}) for m in compressing_codecs()] + CASES


def _sizes(method, cfg, numel, world, rank, dtype, gen):
    """Bytes this rank puts on the wire for one unit: encode's own answer (actual sizes)."""
    core = _C.State(method, dict(cfg, error_feedback=False))
    grad = torch.randn(numel, generator=gen).to(dtype)
    send_splits, _ = core.plan(grad, world, rank)
    send = torch.empty(sum(send_splits), dtype=torch.uint8)
    unit = core.begin(numel)
    return core.encode(grad, send, world, rank, unit), core.counters()


@pytest.mark.parametrize("case", ALL, ids=lambda c: c[0] + "".join(f"-{k}={v}" for k, v in c[1].items()))
def test_no_payload_larger_than_none(case, gen):
    """Every method, default and test configs, every chunk of units from 1 to 70001 elements
    over 2-4 ranks, fp32 and bf16: each payload is at most `none`'s for the same chunk."""
    method, cfg = case
    fell_back = {dtype: 0 for dtype in DTYPES}
    for dtype in DTYPES:
        for world in (2, 3, 4):
            for numel in SIZES:
                rank = numel % world
                mine, ctr = _sizes(method, cfg, numel, world, rank, dtype, gen)
                plain, _ = _sizes("none", {}, numel, world, rank, dtype, gen)
                assert all(a <= b for a, b in zip(mine, plain)), (dtype, world, numel, mine, plain)
                fell_back[dtype] += ctr["fallback_units"]
                assert ctr["fallback_units"] <= 1
                # a fixed-size unit falls back whole; thresholdv's unit stays its, payloads fall back
                assert ctr["calls_uncompressed"] == (0 if method == "thresholdv" else ctr["fallback_units"])
    if method == "none":
        assert sum(fell_back.values()) == 0
    else:  # headers, scales, norms, tables or indices: a 1-element chunk is never smaller
        assert fell_back[torch.float32] > 0 and fell_back[torch.bfloat16] > 0, method
    if method in ("fp16", "bf16"):  # a 16-bit cast saves nothing on bf16 chunks: exact instead
        assert fell_back[torch.bfloat16] == len(SIZES) * 3


def test_fallback_is_exact_and_residual_free(gen):
    """A unit sent as `none` arrives exact and keeps no error-feedback residual."""
    state = fsdpcomp.CommState("sketch", {"error_feedback": True, "compress_own_chunk": True, "cols": 4096})
    x = torch.randn(1000, generator=gen)  # 4000 bytes against a 48 KiB table
    out = torch.empty(1000)
    state.reduce_scatter(x, out)
    c = state.counters()
    assert torch.equal(out, x)
    assert c["fallback_units"] == c["calls_uncompressed"] == 1
    assert c["bytes_sent"] == 32 + 4000 and c["residual_bytes"] == 0
    # min_numel is not a fallback: it is asked for
    small = fsdpcomp.CommState("int8", {"min_numel": 2000, "compress_own_chunk": True})
    small.reduce_scatter(x, out)
    assert small.counters()["calls_uncompressed"] == 1 and small.counters()["fallback_units"] == 0


def _thresholdv(rank, world, pass_ranks):
    """thresholdv over real ranks; the ranks in pass_ranks send gradients most of whose values
    pass the threshold (their payloads fall back to `none`), the others sparse ones."""
    n = 3000 * world + 7
    g = torch.Generator().manual_seed(40 + rank)
    big = rank in pass_ranks
    # all but ~0.1% of 1000 * N(0, 1) pass: indices + values cost more than the values alone
    grad = torch.randn(n, generator=g) * (1000.0 if big else 0.01)
    grad[torch.randperm(n, generator=g)[:50]] = 5.0  # a few values pass on every rank
    state = fsdpcomp.CommState("thresholdv", {"threshold": 1.0, "error_feedback": False})
    shard = -(-n // world)
    out = torch.empty(shard)
    state.reduce_scatter(grad, out)
    return grad, out, dict(state.counters())


@pytest.mark.parametrize("world,pass_ranks", [(2, (0,)), (3, (0, 2)), (3, (0, 1, 2))])
def test_thresholdv_falls_back_per_payload(world, pass_ranks):
    results = run_ranks(_thresholdv, world, pass_ranks)
    grads = [r[0] for r in results]
    n = grads[0].numel()
    shard = -(-n // world)
    for rank, (_, out, c) in enumerate(results):
        lo, hi = rank * shard, min(n, (rank + 1) * shard)
        # what each sender's payload decodes to: exact where it fell back, thresholded elsewhere
        sent = [g[lo:hi] if (r in pass_ranks or r == rank) else torch.where(g[lo:hi].abs() > 1.0, g[lo:hi], 0.0)
                for r, g in enumerate(grads)]
        # thresholdv's sizes are data-dependent: one all-to-all, summed in rank order from zero
        expect = sum(sent[r] for r in range(world)) / world
        assert torch.equal(out[:hi - lo], expect)
        # this rank's payloads: all `none` when its values mostly pass, else all thresholdv
        assert c["fallback_units"] == (1 if rank in pass_ranks else 0)
        assert c["calls_uncompressed"] == 0  # the unit itself was thresholdv's
        plain = 32 + 4 * shard  # header + fp32 values, already a multiple of 16 here
        if rank in pass_ranks:
            assert c["bytes_sent"] <= (world - 1) * (plain + 16 + 8)
        # + the ranks' handshake: an 8-byte digest to each peer, once for this unit shape
        assert c["bytes_sent"] <= c["bytes_raw"] + (world - 1) * (48 + 8)


def small_lm():
    """TinyLM with 8 blocks 40 wide: each block a FSDP unit of ~20k parameters (chunks smaller
    than a 3 x 4096 sketch table, the fixed default before), the root ~170k."""
    return TinyLM(vocab=2048, dim=40, blocks=8, heads=2, ff=160)


def _every_method(rank, world):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    out = {}
    for method in compressing_codecs():
        torch.manual_seed(0)
        model = FSDP(small_lm(), device_id=torch.device("cpu"),
                     auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}), use_orig_params=True)
        state = fsdpcomp.register(model, method)  # the defaults, as a user meets them
        g = torch.Generator().manual_seed(rank)
        for _ in range(2):
            x = torch.randint(0, 2048, (2, 16), generator=g)
            nn.functional.cross_entropy(model(x).reshape(-1, 2048), x.reshape(-1)).backward()
        out[method] = dict(state.counters())
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_method_ratio_at_least_one_on_a_small_model(world):
    """Every method at its defaults on a 0.35M-parameter model: never more bytes than `none`,
    and every unit compressed (before the fallback, sketch sent 0.77x at 3 ranks; before its
    table was sized to the chunk, its blocks went as `none`); thresholdv's default threshold
    passes most of these values, so its payloads go as `none` (ratio 1)."""
    for rank_counters in run_ranks(_every_method, world):
        none = rank_counters["none"]
        for method, c in rank_counters.items():
            assert c["bytes_raw"] == none["bytes_raw"] > 0
            assert c["bytes_sent"] <= none["bytes_sent"], (method, c["bytes_sent"], none["bytes_sent"])
            if method not in ("none", "thresholdv"):
                assert c["fallback_units"] == 0 and c["ratio"] > 1.0, (method, c["fallback_units"], c["ratio"])
        assert rank_counters["thresholdv"]["ratio"] >= 1.0
