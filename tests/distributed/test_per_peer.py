"""The pipelined exchange (config key `pipeline`): encode_part/decode_part write the bytes and
the sums that encode/decode do, one payload at a time, and refuse what would break that. The C
calls are driven in one process as W ranks would drive them; then on real gloo ranks."""
import pytest
import torch

import fsdpcomp
from helpers.dist_utils import run_ranks
from helpers.method_cases import CASES, case_id

PER_PEER = [c for c in CASES + [("none", {}), ("fp16", {}), ("bf16", {})]
            if fsdpcomp.CommState(*c)._core.per_peer_ok(3 * 1001, 3)]
ONE_SHOT = [c for c in CASES if c not in PER_PEER]


def _states(method, cfg, world, numel):
    """One C state per simulated rank, each at the same unit of the same step."""
    states = [fsdpcomp.CommState(method, cfg) for _ in range(world)]
    units = [s._core.begin(numel) for s in states]
    return states, units[0]


def _grads(world, numel, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(world)]


def _slot(buf, splits, r):
    at = sum(splits[:r])
    return buf[at:at + splits[r]]


def test_the_per_peer_split_is_what_the_docs_say():
    names = {m for m, _ in PER_PEER}
    assert {"none", "fp16", "bf16", "int8", "fp8", "intN", "qsgd", "nc", "onebit"} <= names
    # data-dependent sizes, a second round, or a compressed-domain sum: one exchange
    for method, cfg in [("thresholdv", {"threshold": 1.0}), ("sketch", {"rows": 3, "cols": 512, "k": 64}),
                        ("gradiveq", {"dim": 16, "k": 4}), ("signsgd", {}), ("randomk", {"ratio": 0.1})]:
        assert (method, cfg) in ONE_SHOT or not fsdpcomp.CommState(method, cfg)._core.per_peer_ok(3003, 3)


@pytest.mark.parametrize("case", PER_PEER, ids=case_id)
def test_parts_write_the_bytes_and_sums_of_the_one_shot_call(case):
    method, cfg = case
    world, numel = 3, 3 * 1001 - 2  # the last chunk is shorter
    cfg = dict(cfg, error_feedback=method != "none")
    grads = _grads(world, numel)
    whole, unit = _states(method, cfg, world, numel)
    parts, _ = _states(method, cfg, world, numel)
    sends = []
    for r in range(world):
        ss, rs = whole[r]._core.plan(grads[r], world, r)
        a = torch.zeros(sum(ss), dtype=torch.uint8)
        b = torch.full((sum(ss),), 0xAB, dtype=torch.uint8)  # poisoned: every byte is written
        whole[r]._core.encode(grads[r], a, world, r, unit)
        for k in (2, 0, 1):  # any order
            dst = (r + k) % world
            size = parts[r]._core.encode_part(grads[r], b, world, r, unit, dst, 0)
            assert size == (0 if dst == r else ss[dst])
        assert torch.equal(a, b), f"rank {r}: payload bytes differ"
        if method != "none":
            assert torch.equal(parts[r]._core.residuals()[0], whole[r]._core.residuals()[0])
        kw, kp = whole[r].counters(), parts[r].counters()
        for key in ("calls", "bytes_sent", "bytes_raw", "elements", "chunks_sent", "error_samples", "residual_norm"):
            assert kp[key] == kw[key], key
        sends.append((a, ss))
    for r in range(world):
        recv = torch.cat([_slot(sends[s][0], sends[s][1], r) for s in range(world)])
        ref = torch.empty(1001)
        whole[r]._core.decode(recv, grads[r], ref, world, r, unit)
        out = torch.full((1001,), float("nan"))
        for k in range(world):
            src = (r + k) % world
            parts[r]._core.decode_part(_slot(sends[src][0], sends[src][1], r), grads[r], out, world, r,
                                       unit, src, 0)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # same terms, another order
        assert parts[r].counters()["calls"] == 1


def test_none_sums_in_cyclic_order_exactly():
    world, shard = 4, 513
    grads = _grads(world, world * shard, seed=1)
    states, unit = _states("none", {}, world, world * shard)
    sends = []
    for r in range(world):
        ss, _ = states[r]._core.plan(grads[r], world, r)
        buf = torch.empty(sum(ss), dtype=torch.uint8)
        for dst in range(world):
            states[r]._core.encode_part(grads[r], buf, world, r, unit, dst, 0)
        sends.append((buf, ss))
    for r in range(world):
        acc = torch.zeros(shard)
        for k in range(world):  # own chunk, then rank+1, rank+2, ...
            src = (r + k) % world
            acc = acc + grads[src][r * shard:(r + 1) * shard]
        out = torch.empty(shard)
        for k in range(world):
            src = (r + k) % world
            states[r]._core.decode_part(_slot(sends[src][0], sends[src][1], r), grads[r], out, world, r, unit,
                                        src, 0)
        assert torch.equal(out, acc / world), f"rank {r}"


def test_parts_refuse_what_would_break_the_sum():
    world, numel = 3, 300
    g = torch.randn(numel)
    s = fsdpcomp.CommState("int8", {"block_size": 32})
    unit = s._core.begin(numel)
    ss, rs = s._core.plan(g, world, 1)
    send = torch.empty(sum(ss), dtype=torch.uint8)
    out = torch.empty(100)
    with pytest.raises(ValueError, match=r"chunk must be in \[0, 3\)"):
        s._core.encode_part(g, send, world, 1, unit, 3, 0)
    with pytest.raises(ValueError, match=r"piece must be in \[0, 1\) for chunk 0, got 1"):
        s._core.encode_part(g, send, world, 1, unit, 0, 1)
    s._core.encode_part(g, send, world, 1, unit, 0, 0)
    with pytest.raises(RuntimeError, match="chunk 0 of unit 0: piece 0, expected piece 1"):
        s._core.encode_part(g, send, world, 1, unit, 0, 0)
    with pytest.raises(ValueError, match="send has 10 bytes, the parts of this call need"):
        s._core.encode_part(g, send[:10], world, 1, unit, 2, 0)
    empty = torch.empty(0, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="own chunk .src=1. comes first"):
        s._core.decode_part(send[:rs[2]], g, out, world, 1, unit, 2, 0)
    s._core.decode_part(empty, g, out, world, 1, unit, 1, 0)
    with pytest.raises(RuntimeError, match="expected src=2 piece 0, got src=0 piece 0"):
        s._core.decode_part(send[:rs[0]], g, out, world, 1, unit, 0, 0)
    s._core.decode_part(empty, g, out, world, 1, unit, 1, 0)  # the own chunk reopens the call
    with pytest.raises(fsdpcomp.PayloadError, match=r"payload from rank 2 \(piece 0\) has 16 bytes, the plan"):
        s._core.decode_part(send[:16], g, out, world, 1, unit, 2, 0)
    with pytest.raises(ValueError, match="output has 10 elements, the shard needs 100"):
        s._core.decode_part(empty, g, out[:10], world, 1, unit, 1, 0)
    with pytest.raises(ValueError, match=r"src must be in \[0, 3\)"):
        s._core.decode_part(empty, g, out, world, 1, unit, -1, 0)


def test_pieces_cut_large_payloads_of_piecewise_methods_only():
    g = torch.randn(2 * 300_000)  # chunks of 300000: 5 pieces of 65536 (the alignment), the last shorter
    int8 = fsdpcomp.CommState("int8", {"pipeline_piece": 1})
    send, recv = int8._core.pieces(g, 2, 0)
    assert send[0] == (0,) and recv[0] == (0,)  # the own chunk: one empty part
    piece = int8._core.payload_bytes(65536)
    assert send[1] == recv[1] == (piece,) * 4 + (int8._core.payload_bytes(300_000 - 4 * 65536),)
    assert fsdpcomp.CommState("int8")._core.pieces(g, 2, 0)[0][1] == (int8._core.payload_bytes(300_000),)
    topk = fsdpcomp.CommState("topk", {"ratio": 0.1, "pipeline_piece": 1})  # k is per chunk: never cut
    assert len(topk._core.pieces(g, 2, 0)[0][1]) == 1


@pytest.mark.parametrize("method, cfg", [("signsgd", {}), ("thresholdv", {"threshold": 1.0}),
                                         ("sketch", {"rows": 3, "cols": 64, "k": 8, "second_round": True})])
def test_one_exchange_methods_name_why(method, cfg):
    s = fsdpcomp.CommState(method, cfg)
    g = torch.randn(3000)
    unit = s._core.begin(3000)
    ss, _ = s._core.plan(g, 3, 0)
    with pytest.raises(ValueError, match=f"method '{method}' .*encode all chunks at once"):
        s._core.encode_part(g, torch.empty(sum(ss), dtype=torch.uint8), 3, 0, unit, 1, 0)
    with pytest.raises(ValueError, match=f"method '{method}' .*decode all payloads at once"):
        s._core.decode_part(torch.empty(0, dtype=torch.uint8), g, torch.empty(1000), 3, 0, unit, 0, 0)


def _reduce(rank, world, method, cfg):
    out = {}
    for pipeline in (True, False):
        state = fsdpcomp.CommState(method, dict(cfg, pipeline=pipeline))
        shard = 1037
        results = []
        for step in range(3):  # error feedback carries over
            g = torch.Generator().manual_seed(100 * step + rank)
            o = torch.full((shard,), float("nan"))
            state.reduce_scatter(torch.randn(world * shard, generator=g), o)
            state.end_step()
            results.append(o)
        out[pipeline] = (results, state.counters())
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("method, cfg", [("int8", {"error_feedback": True, "block_size": 64}),
                                         ("onebit", {"error_feedback": True})])
def test_pipelined_reduce_scatter_on_gloo_ranks(world, method, cfg):
    for rank, res in enumerate(run_ranks(_reduce, world, method, cfg)):
        (piped, kp), (one_shot, kw) = res[True], res[False]
        for a, b in zip(piped, one_shot):
            assert not torch.isnan(a).any()
            if world == 2 or rank == 0:  # two addends, or cyclic order = rank order: same bits
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert kp["bytes_sent"] == kw["bytes_sent"] and kp["calls"] == kw["calls"] == 3
        assert kp["comm_time_s"] > 0


def _subgroup(rank, world):
    import torch.distributed as dist
    group = dist.new_group([1, 2])  # group ranks 0, 1 are global ranks 1, 2
    if rank == 0:
        return None
    state = fsdpcomp.CommState("none", process_group=group)
    grads = [torch.arange(8, dtype=torch.float32) * (r + 1) for r in (1, 2)]
    out = torch.empty(4)
    state.reduce_scatter(grads[rank - 1], out)
    return out


def test_subgroup_peers_are_addressed_by_global_rank():
    _, a, b = run_ranks(_subgroup, 3)
    mean = (torch.arange(8, dtype=torch.float32) * 2 + torch.arange(8, dtype=torch.float32) * 3) / 2
    assert torch.equal(a, mean[:4]) and torch.equal(b, mean[4:])


def _pieced(rank, world, method, cfg):
    shard = 300_001
    grads = [torch.randn(world * shard, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    exact = torch.stack([g[rank * shard:(rank + 1) * shard] for g in grads]).double().mean(0)
    out = {}
    for piece in (1, 0):  # 65536-element pieces, then whole payloads
        state = fsdpcomp.CommState(method, dict(cfg, pipeline_piece=piece))
        o = torch.full((shard,), float("nan"))
        state.reduce_scatter(grads[rank], o)
        out[piece] = (o, state.counters(), float((o.double() - exact).norm() / exact.norm()))
    return out


@pytest.mark.parametrize("method, cfg", [("none", {}), ("int8", {"block_size": 256, "error_feedback": True}),
                                         ("qsgd", {})])
def test_pieces_on_gloo_ranks(method, cfg):
    for res in run_ranks(_pieced, 2, method, cfg):
        (a, ka, err_a), (b, kb, err_b) = res[1], res[0]
        assert not torch.isnan(a).any()
        assert ka["chunks_sent"] == 5 and kb["chunks_sent"] == 1
        assert ka["bytes_sent"] > kb["bytes_sent"]  # four more headers
        if method == "qsgd":  # each piece draws from its own stream: another rounding, same law
            assert not torch.equal(a, b) and abs(err_a - err_b) < 0.02 * err_b
        else:  # nearest rounding, blocks never split: the same values
            assert torch.equal(a, b)
