"""Ranks agree before they exchange: the first call of each unit shape on a process
group compares a fingerprint of everything that decides payload sizes and meanings, and a
mismatch is a ValueError on every rank naming the keys that differ; the header carries the
config's fingerprint too, so a mismatch that slips past the handshake is a PayloadError, never
a gloo abort or silently wrong gradients."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.dist_utils import run_ranks
from helpers.wire_sim import exchange

MISMATCHES = [  # (rank 0, rank 1, a key the error must name)
    (("int8", {}), ("fp16", {}), "method"),
    (("int8", {"block_size": 256}), ("int8", {"block_size": 64}), "block_size"),
    (("signsgd", {}), ("signsgd", {"mode": "majority"}), "mode"),
    (("fp8", {"format": "e4m3"}), ("fp8", {"format": "e5m2"}), "format"),
    (("qsgd", {"levels": 7}), ("qsgd", {"levels": 5}), "levels"),
    (("randomk", {"seed": 0}), ("randomk", {"seed": 1}), "seed"),
    (("sketch", {"seed": 3}), ("sketch", {"seed": 4}), "seed"),
    (("gradiveq", {}), ("gradiveq", {"seed": 9}), "seed"),
    (("int8", {"pipeline": True}), ("int8", {"pipeline": False}), "pipeline"),
]


def _mismatch_worker(rank, world, cases):
    results = []
    for i, (a, b, _) in enumerate(cases):
        method, cfg = a if rank == 0 else b
        state = fsdpcomp.CommState(method, cfg)
        n = 1000 + 16 * i  # a fresh shape per case
        try:
            state.reduce_scatter(torch.randn(n), torch.empty(n // world))
            results.append(("ok", ""))
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            results.append((type(e).__name__, str(e)))
    return results


def test_mismatched_configs_raise_value_error_on_every_rank():
    per_rank = run_ranks(_mismatch_worker, 2, MISMATCHES)
    for rank, results in enumerate(per_rank):
        for (a, b, key), (kind, msg) in zip(MISMATCHES, results):
            assert kind == "ValueError", (rank, a, b, kind, msg)
            assert key in msg and "rank 0" in msg and "rank 1" in msg, msg


def _agreeing_worker(rank, world):
    state = fsdpcomp.CommState("int8", {})
    for _ in range(3):
        for n in (1000, 600, 1000):
            state.reduce_scatter(torch.randn(n), torch.empty(n // world))
        state.end_step()
    return state.counters()["extra_collectives"]


def test_the_handshake_is_one_extra_collective_per_shape():
    assert run_ranks(_agreeing_worker, 2) == [2, 2]


def _later_mismatch_worker(rank, world):
    state = fsdpcomp.CommState("fp8", {"format": "e4m3"})
    state.reduce_scatter(torch.randn(1000), torch.empty(500))
    state.end_step()
    if rank == 1:  # rebuilt alone with another config of the same payload sizes
        state = fsdpcomp.CommState("fp8", {"format": "e5m2"})
    try:
        state.reduce_scatter(torch.randn(1000), torch.empty(500))
        return ("ok", "")
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def test_a_rank_rebuilt_with_another_config_is_a_payload_error():
    results = run_ranks(_later_mismatch_worker, 2, timeout=120)
    for kind, msg in results:
        assert kind == "PayloadError", msg
        assert "config" in msg
    assert "format" in results[1][1]  # the rank that changed knows what it changed


def test_header_fingerprint_names_the_config():
    a = _C.State("int8", {"block_size": 256})
    b = _C.State("int8", {"block_size": 256, "seed": 5})
    x = torch.randn(1000)
    p = torch.empty(a.payload_bytes(1000), dtype=torch.uint8)
    a.compress(x, p)
    with pytest.raises(fsdpcomp.PayloadError, match="config"):
        b.decompress(p, torch.zeros(1000))
    assert a.fingerprint != b.fingerprint
    # keys a rank may choose alone do not change what goes on the wire
    c = _C.State("int8", {"block_size": 256, "error_stats_every": 3, "nonfinite": "zero",
                          "residual_dtype": "bf16", "error_feedback": True})
    assert c.fingerprint == a.fingerprint
    c.decompress(p, torch.zeros(1000))


def test_header_names_the_world():
    a = _C.State("int8", {})
    x = torch.randn(1000)
    p = torch.empty(a.payload_bytes(1000), dtype=torch.uint8)
    a.compress(x, p, world=4, rank=1)
    with pytest.raises(fsdpcomp.PayloadError, match="world 4.*2"):
        a.decompress(p, torch.zeros(1000), world=2)


def test_same_size_mismatch_in_one_process_is_a_payload_error():
    states = [fsdpcomp.CommState("qsgd", {"levels": 7}), fsdpcomp.CommState("qsgd", {"levels": 5})]
    with pytest.raises(fsdpcomp.PayloadError, match="config"):
        exchange(states, [torch.randn(1000), torch.randn(1000)], [torch.empty(500), torch.empty(500)])


PARAM_MISMATCHES = [  # FSDP2 parameter all-gathers: (rank 0's config, rank 1's, a key the error names)
    ({"param_gather": "int8"}, {"param_gather": "bf16"}, "param_gather"),
    ({"param_gather": "int8", "param_gather_block_size": 256},
     {"param_gather": "int8", "param_gather_block_size": 64}, "param_gather_block_size"),
    ({"param_gather": "fp8"}, {}, "param_gather"),  # fp8 payloads against torch's own all-gather
]


def _gather_worker(rank, world, cases):
    import torch.distributed as dist
    from fsdpcomp import AllGather

    results = []
    for i, (a, b, _) in enumerate(cases):
        state = fsdpcomp.CommState("int8", a if rank == 0 else b)
        n = 512 + 16 * i  # a fresh shard shape per case
        out = torch.empty(world * n)
        try:
            for _ in range(3):
                AllGather(state)(out, torch.randn(n), dist.group.WORLD)
            results.append(("ok", state.counters()["extra_collectives"]))
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            results.append((type(e).__name__, str(e)))
    return results


def test_mismatched_parameter_gathers_raise_value_error_on_every_rank():
    """Before the first gather of a shard shape (FSDP2's forward, before any reduce-scatter):
    on main, int8 against bf16 payloads of other sizes took gloo down."""
    cases = PARAM_MISMATCHES + [({"param_gather": "int8"}, {"param_gather": "int8"}, None)]
    for rank, results in enumerate(run_ranks(_gather_worker, 2, cases)):
        for (a, b, key), (kind, msg) in zip(cases, results):
            if key is None:  # the ranks agree: one handshake for three gathers of the shape
                assert (kind, msg) == ("ok", 1), (rank, kind, msg)
                continue
            assert kind == "ValueError", (rank, a, b, kind, msg)
            assert key in msg and "parameter all-gather" in msg and "rank 1" in msg, msg
