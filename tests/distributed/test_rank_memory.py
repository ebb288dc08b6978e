"""Every rank's memory, counted, on 2 gloo ranks: under FSDP2 the counters equal the tensors the
state holds (the residuals; the buffers of the reduce-scatter and of the parameter all-gathers)
and what benchmarks/mem_model.py computes from the units' shapes, as do FSDP2's own parameters,
gradients and AdamW state; an all-reduce's residual_bytes include its all-gather half's
residuals; results.jsonl lists each rank's. One spawn for all of it (spawns are slow)."""
import os
import sys

import pytest
import torch
import torch.nn as nn

import fsdpcomp
from helpers.dist_utils import run_ranks

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))
import mem_count  # noqa: E402
import mem_model  # noqa: E402

TOPK = {"ratio": 0.05, "param_gather": "int8", "param_gather_block_size": 64}


def _model():
    torch.manual_seed(0)
    # dims that W = 2 does not divide (FSDP2 pads them), and units of three sizes: the backward
    # reduces the second one before the larger first one, which regrows the buffers
    return nn.Sequential(nn.Linear(33, 300), nn.Tanh(), nn.Linear(300, 31), nn.Tanh(), nn.Linear(31, 7))


def _units(model):
    inner = [model[0], model[2]]
    ids = {id(p) for m in inner for p in m.parameters()}
    return [[tuple(p.shape) for p in m.parameters()] for m in inner] + \
        [[tuple(p.shape) for p in model.parameters() if id(p) not in ids]]


def _fsdp2(rank, world):
    model = _model()
    units = _units(model)
    for i in (0, 2):
        fully_shard(model[i])
    fully_shard(model)
    state = fsdpcomp.register(model, "topk", TOPK)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    reached = []
    for _ in range(2):
        model(torch.randn(8, 33, generator=g)).square().mean().backward()
        grads = mem_count.grads_bytes(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        # every buffer storage the exchange reaches, its cached per-peer and all-to-all views included: after
        # the first step's regrowth too, no old buffer may stay alive unseen by buffer_bytes
        exchange = state._reducer.exchange
        views = [t for p in [*exchange._slots.values(), *exchange._all_to_all.values()] for t in (p.send, p.recv)]
        reached.append((mem_count.storage_bytes(list(state._reducer.exchange.buffers._bufs.values()) + views),
                         state.counters()["buffer_bytes"]))
    return {"counters": dict(state.counters()), "units": units, "grads": grads, "reached": reached,
            "params": mem_count.params_bytes(model), "optimizer": mem_count.optimizer_bytes(opt),
            "residual": mem_count.residual_bytes(state), "by_kind": mem_count.buffer_bytes(state)}


def _all_reduce(rank, world):
    state = fsdpcomp.CommState("int8", {"error_feedback": True, "block_size": 64})
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(2):
        for n in (3000, 700):
            state.all_reduce(torch.randn(n, generator=g), key=n)
        state.end_step()
    core = sum(t.numel() * t.element_size() for t in state._core.residuals() if t is not None)
    gather = sum(t.numel() * t.element_size() for t in state._core.residuals("gather") if t is not None)
    return {"counters": dict(state.counters()), "core": core, "gather": gather,
            "residual": mem_count.residual_bytes(state), "by_kind": mem_count.buffer_bytes(state)}


def _both(rank, world):
    return _fsdp2(rank, world), _all_reduce(rank, world)


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_both, 2)


def test_fsdp2_counters_are_the_tensors_and_the_computed_bytes(ranks):
    for r, _ in ranks:
        c = r["counters"]
        assert c["residual_bytes"] == r["residual"] > 0
        assert c["buffer_bytes"] == sum(r["by_kind"].values())
        assert all(reached == counted for reached, counted in r["reached"]), r["reached"]
        assert c["buffer_peak_bytes"] > c["buffer_bytes"]  # the smaller units' buffers, while regrown
        assert {"send", "recv", "param_gather_sendtorch.uint8", "param_gather_recvtorch.uint8"} <= set(r["by_kind"])
    # mem_model.py from the shapes alone: rank 0 holds the largest shards, every rank the residual
    payload = fsdpcomp.CommState("topk", TOPK)._core.payload_bytes  # the codec's size rule
    computed = mem_model.per_rank(ranks[0][0]["units"], 2, payload)
    for part in ("params", "grads", "optimizer"):
        assert max(r[part] for r, _ in ranks) == computed[part], part
    for r, _ in ranks:
        assert r["residual"] == computed["residual_fp32"]
        assert r["by_kind"]["send"] + r["by_kind"]["recv"] == pytest.approx(computed["buffers"], rel=0.01)


def test_all_reduce_residual_bytes_include_the_all_gather_halves(ranks):
    for _, r in ranks:
        assert r["gather"] > 0 and r["core"] > 0
        assert r["counters"]["residual_bytes"] == r["core"] + r["gather"] == r["residual"]
        assert r["gather"] == 4 * (3000 + 700) // 2  # fp32, this rank's reduced shard of each unit
        assert {"gather_send", "gather_recv"} <= set(r["by_kind"])
        assert r["counters"]["buffer_bytes"] == sum(r["by_kind"].values())


def test_results_line_lists_each_ranks_memory(ranks):
    per_rank = [r["counters"] for r, _ in ranks]
    combined = fsdpcomp.combine_counters(per_rank)
    run = {"run_name": "r", "world_size": 2, "model": "m", "dataset": "d", "max_length": 8, "batch_size": 8,
           "compress_method": "topk", "compress_config": TOPK, "seed": 0, "train_loss": 1.0, "val_loss": None,
           "val_ppl": None}
    rec = fsdpcomp.build_record(run=run, step_times_s=[0.1], tokens_per_step=1, counters=combined)
    for key in ("residual_bytes", "buffer_bytes", "buffer_peak_bytes"):
        assert rec[key + "_by_rank"] == [c[key] for c in per_rank] and all(rec[key + "_by_rank"]), key
