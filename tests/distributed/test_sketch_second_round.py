"""Sketched-SGD's second round for `sketch` (`"second_round": true`) on real 2- and 3-rank gloo
groups: each owner picks k heavy coordinates from the summed sketches, fetches every rank's
exact values there, and the decoded sum at those coordinates is the exact sum of the ranks'
inputs; each sender's residual is its input with the fetched coordinates set to 0; the two
extra collectives and their bytes are counted."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

K = 12
CFG = {"rows": 5, "cols": 256, "k": K, "second_round": True}


def _grads(rank, world, n, seed):
    """Noise plus a few heavy coordinates shared by every rank (what a sketch can find)."""
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed + rank)) * 0.1
    heavy = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:K * world // 2]
    g[heavy] += 5.0 * (1 + torch.arange(heavy.numel(), dtype=torch.float32) / heavy.numel())
    return g, heavy


def _run(rank, world, n, seed, steps):
    state = fsdpcomp.CommState("sketch", CFG)
    shard = -(-n // world)
    rows = []
    e = torch.zeros(n)
    for step in range(steps):
        g, heavy = _grads(rank, world, n, seed + 1000 * step)
        out = torch.empty(shard)
        state.reduce_scatter(g, out)
        # a unit of 4 elements: its chunks are far smaller than the sketch table, so it goes as
        # `none` (no second round), and its decode is the exact mean
        tiny = torch.arange(4, dtype=torch.float32) * (rank + 1) + step
        tiny_out = torch.empty(-(-4 // world))
        state.reduce_scatter(tiny, tiny_out)
        state.end_step()
        e_new = own(state.state_dict()).residuals["scatter"][0].clone()
        exact = sum(torch.arange(4, dtype=torch.float32) * (r + 1) + step for r in range(world)) / world
        lo = rank * len(tiny_out)
        assert torch.allclose(tiny_out[:max(0, min(4, lo + len(tiny_out)) - lo)],
                              exact[lo:lo + len(tiny_out)], rtol=1e-6, atol=0)
        rows.append((g, g + e, out, e_new, heavy))
        e = e_new
    # the control: the first step's data decoded from the estimates, without the second round
    est = torch.empty(shard)
    g, _ = _grads(rank, world, n, seed)
    fsdpcomp.CommState("sketch", dict(CFG, second_round=False, error_feedback=False)).reduce_scatter(g, est)
    return rows, dict(state.counters()), est


# chunks of 3000: the 5 KiB table is smaller than even their 16-bit size, so the unit compresses
@pytest.mark.parametrize("world,n", [(2, 6000), (3, 9000)])
def test_decoded_sum_at_the_picks_is_exact(world, n):
    steps = 2
    per_rank = run_ranks(_run, world, n, 55, steps)
    shard = -(-n // world)
    for step in range(steps):
        xs = [per_rank[r][0][step][1] for r in range(world)]  # g' = g + e_old on each rank
        grads = [per_rank[r][0][step][0] for r in range(world)]
        for owner in range(world):
            lo, hi = owner * shard, min(n, (owner + 1) * shard)
            out = per_rank[owner][0][step][2][:hi - lo]
            own = grads[owner][lo:hi]
            # the picks: where some peer's value arrived (every peer sends exactly those)
            peers = [r for r in range(world) if r != owner]
            e_peer = per_rank[peers[0]][0][step][3][lo:hi]
            picked = (e_peer == 0) & (xs[peers[0]][lo:hi] != 0)
            assert int(picked.sum()) == K
            exact = own + sum(xs[r][lo:hi] for r in peers)
            torch.testing.assert_close(out[picked], exact[picked] / world, rtol=1e-6, atol=1e-7)
            assert torch.equal(out[~picked], own[~picked] / world)  # the peers sent nothing else
            for r in peers:  # each sender's residual: its g' with the picks set to 0
                e_r = per_rank[r][0][step][3][lo:hi]
                assert torch.equal(e_r, torch.where(picked, torch.zeros(()), xs[r][lo:hi]))
            if step == 0:
                # the sketch found the planted heavy coordinates of this chunk
                heavy = per_rank[0][0][step][4]
                assert picked[heavy[(heavy >= lo) & (heavy < hi)] - lo].all()
                # and the estimates alone would have missed the exact sum there
                est = per_rank[owner][2][:hi - lo]
                assert (est[picked] - exact[picked] / world).abs().max() > 1e-3
    for r in range(world):
        c = per_rank[r][1]
        # one extra all-gather (picks) and one extra all-to-all (values) per call of the big
        # unit (the tiny one went as `none`), and the ranks' handshake once per unit shape
        assert c["extra_collectives"] == 2 * steps + 2
        assert c["calls_uncompressed"] == steps
        assert c["extra_collective_time_s"] > 0
        sketch_bytes = 4 * CFG["rows"] * CFG["cols"]
        # the tiny unit: its chunks (2 elements each, the third empty at W = 3) as fp32 values
        tiny_len = [min(2, max(0, 4 - 2 * c_)) for c_ in range(world)]
        tiny_sent = sum(k for c_, k in enumerate(tiny_len) if c_ != r)
        assert c["index_bytes"] == steps * 4 * K * (world - 1)
        assert c["value_bytes"] == steps * ((world - 1) * (sketch_bytes + 4 * K) + 4 * tiny_sent)
        assert c["header_bytes"] + c["value_bytes"] + c["meta_bytes"] + c["index_bytes"] == c["bytes_sent"]
        assert c["error_samples"] == 0  # round 1 decodes nothing worth sampling


N_LOOP = 4000  # a chunk the table compresses (smaller than its 16-bit size)


def _loopback(gen_seed):
    """One rank compressing its own chunk: the second round loops back through the same calls."""
    g = torch.randn(N_LOOP, generator=torch.Generator().manual_seed(gen_seed))
    state = fsdpcomp.CommState("sketch", dict(CFG, compress_own_chunk=True))
    out = torch.empty(N_LOOP)
    state.reduce_scatter(g, out)
    return g, out, state


def test_one_rank_loopback_keeps_the_error_feedback_identity():
    g, out, state = _loopback(3)
    e = own(state.state_dict()).residuals["scatter"][0]
    assert int((out != 0).sum()) == K and torch.equal(out + e, g)
    assert torch.equal(out[out != 0], g[out != 0])
    assert state.counters()["extra_collectives"] == 0  # nothing crossed a process boundary


def test_bad_config_and_out_of_order_calls_are_refused():
    with pytest.raises(ValueError, match="'k' must be > 0 with 'second_round'"):
        fsdpcomp.CommState("sketch", {"k": 0, "second_round": True})
    with pytest.raises(ValueError, match="'second_round' must be true or false"):
        fsdpcomp.CommState("sketch", {"second_round": 1})
    with pytest.raises(ValueError, match="'allgather_compress' cannot be combined with 'second_round'"):
        fsdpcomp.CommState("sketch", {"second_round": True, "allgather_compress": True})
    s = _C.State("sketch", CFG)
    unit = s.begin(100)
    picks = torch.zeros(4 * K, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="decode\\(\\) has not picked"):
        s.fetch_picks(unit, picks)
    assert _C.State("sketch", dict(CFG, second_round=False)).fetch_kmax(20000, 2) == 0
    assert s.fetch_kmax(20000, 2) == K and s.fetch_kmax(20000, 1) == 0  # one rank sends nothing
    # chunks smaller than the table: the unit goes as `none`, with no second round
    assert s.fetch_kmax(100, 2) == 0


def test_corrupted_picks_are_a_payload_error_and_change_nothing():
    g, _, state = _loopback(4)
    core = state._core
    state.end_step()
    unit = core.begin(N_LOOP)
    e_old = core.residuals()[0].clone()
    send = torch.zeros(core.payload_bytes(N_LOOP), dtype=torch.uint8)
    recv_sizes = core.encode(g, send, 1, 0, unit)
    out = torch.empty(N_LOOP)
    core.decode(send[:sum(recv_sizes)], g, out, 1, 0, unit)
    picks = torch.zeros(4 * K, dtype=torch.uint8)
    core.fetch_picks(unit, picks)
    e = core.residuals()[0].clone()  # round 1 left the whole g' there
    assert torch.equal(e, g + e_old)
    bad = picks.view(torch.int32).clone()
    bad[3] = N_LOOP + 100  # past the chunk
    vals = torch.zeros(4 * K, dtype=torch.uint8)
    with pytest.raises(fsdpcomp.PayloadError, match=f"picks from rank 0: index {N_LOOP + 100} at position 3"):
        core.fetch(bad.view(torch.uint8), g, vals, 1, 0, unit)
    bad = picks.view(torch.int32).clone()
    bad[5] = bad[4]  # not ascending
    with pytest.raises(fsdpcomp.PayloadError, match="not ascending"):
        core.fetch(bad.view(torch.uint8), g, vals, 1, 0, unit)
    with pytest.raises(ValueError, match="send buffer holds 3 values, need 12"):
        core.fetch(picks, g, torch.zeros(12, dtype=torch.uint8), 1, 0, unit)
    assert torch.equal(core.residuals()[0], e)  # refused before anything changed
    ss, rs = core.fetch(picks, g, vals, 1, 0, unit)
    assert ss == rs == (K,)
    core.finish(vals, g, out, 1, 0, unit)
    assert torch.equal(out + core.residuals()[0], g + e_old)
