"""DistributedDataParallel on gloo/CPU with fsdpcomp.ddp_hook: equal to DDP's own all-reduce with
`none`, training with lossy methods, per-bucket keys across DDP's bucket rebuild, counters, bad
input. One spawn per world size runs every scenario (spawns are slow)."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fsdpcomp
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

STEPS = 4
# `none` sends fp32 exactly. DDP divides each gradient by the world size and sums in gloo's
# order; fsdpcomp sums in rank order in fp32 and divides once: a few ulp per element per step,
# well inside 1e-6 absolute for O(1) parameters after 4 SGD steps.
TOL = 1e-6
BUCKET_MB = 0.0005  # 512 bytes: several buckets for a few hundred parameters


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 9),
                               torch.nn.Tanh(), torch.nn.Linear(9, 4)).to(dtype)


def _data(rank, steps, dtype=torch.float32):
    g = torch.Generator().manual_seed(2000 + rank)
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(7))
    xs = [torch.randn(16, 6, generator=g) for _ in range(steps)]
    return [(x.to(dtype), torch.tanh(x @ w).to(dtype)) for x in xs]


def _train(rank, steps, method=None, config=None, lr=0.05):
    model = DDP(_model(), bucket_cap_mb=BUCKET_MB)
    state = fsdpcomp.register(model, method, config) if method else None
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in _data(rank, steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / dist.get_world_size())
    return [p.detach().clone() for p in model.parameters()], losses, state


def _bad_input(rank, world):
    """A float64 model: the hook refuses the bucket with a message naming the dtype."""
    model = DDP(_model(torch.float64))
    state = fsdpcomp.register(model, "int8")
    x, y = _data(rank, 1, torch.float64)[0]
    try:
        torch.nn.functional.mse_loss(model(x), y).backward()
        return None, state.counters()["calls"]
    except Exception as e:  # DDP re-raises the hook's error from backward
        return str(e), state.counters()["calls"]


def _scenarios(rank, world):
    base, _, _ = _train(rank, STEPS)
    mine, _, state = _train(rank, STEPS, "none")
    res = {"none": (base, mine, dict(state.counters()), own(state.state_dict()).unit_keys)}
    lossy = {"int8": {"block_size": 64}}
    if "topk" in fsdpcomp.methods():
        lossy["topk"] = {"ratio": 0.25, "error_feedback": True}
    for method, config in lossy.items():
        _, losses, state = _train(rank, 40, method, config, lr=0.2)
        res[method] = (losses, dict(state.counters()))
    # both halves of the all-reduce compressed: replicas must still hold the same bits
    params, losses, state = _train(rank, 40, "int8", {"block_size": 64, "allgather_compress": True,
                                                       "error_feedback": True}, lr=0.2)
    res["int8-gather"] = (losses, dict(state.counters()), params)
    # the opt-out: the reduced shards go back in fp32
    _, _, state = _train(rank, 40, "int8", {"block_size": 64, "allgather_compress": False}, lr=0.2)
    res["int8-plain-gather"] = dict(state.counters())
    res["bad"] = _bad_input(rank, world)
    return res


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return request.param, run_ranks(_scenarios, request.param)


def test_none_equals_ddp_allreduce(ranks):
    world, results = ranks
    for rank, res in enumerate(results):
        base, mine, ctr, keys = res["none"]
        for b, m in zip(base, mine):
            assert torch.allclose(b, m, atol=TOL, rtol=0), (rank, (b - m).abs().max().item())
        n_buckets = len(keys)
        assert n_buckets >= 2, keys  # the small bucket cap gives several buckets
        # one unit per bucket, keyed by its parameters' names, every parameter in one bucket
        names = [n for _, ps in keys for n in ps]
        assert all(k[0] == "ddp" for k in keys) and sorted(names) == sorted(set(names)) and len(names) == 6
        # the first backward is uncompressed (DDP rebuilds its buckets after it)
        assert ctr["calls"] == (STEPS - 1) * n_buckets and ctr["step"] == STEPS - 1
        n_params = sum(p.numel() for p in base)
        assert ctr["elements"] == (STEPS - 1) * n_params
        assert ctr["bytes_sent"] > 0


@pytest.mark.parametrize("method", ["int8", "topk"])
def test_lossy_methods_train(ranks, method):
    world, results = ranks
    if method not in results[0]:
        pytest.skip(f"{method} is not in fsdpcomp.methods()")
    losses, ctr = results[0][method]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    assert ctr["step"] == 39 and ctr["calls"] > 0
    assert ctr["bytes_sent"] < ctr["bytes_raw"]  # all-gather bytes (uncompressed) are in both


def test_compressed_all_gather_trains_and_keeps_replicas_identical(ranks):
    world, results = ranks
    losses, ctr, params = results[0]["int8-gather"]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(params, other["int8-gather"][2]))
    plain = results[0]["int8-plain-gather"]
    assert ctr["ratio"] > 1.5 * plain["ratio"], (ctr["ratio"], plain["ratio"])
    assert results[0]["int8"][1]["ratio"] == pytest.approx(ctr["ratio"], rel=0.01)  # the default


def test_bad_input_is_refused(ranks):
    world, results = ranks
    for msg, calls in (r["bad"] for r in results):
        assert msg is not None and "float64" in msg and "bucket" in msg, msg
        assert calls == 0


def test_hook_refuses_a_non_state():
    with pytest.raises(TypeError, match="CommState"):
        fsdpcomp.ddp_hook("int8", None)
