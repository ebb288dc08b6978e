"""All-reduce paths (DDP, FSDP1 NO_SHARD, FSDP2's replica all-reduce) compress both halves by
default (`allgather_compress` true): int8 sends >= 3.5x fewer bytes than an uncompressed
all-reduce, every rank holds the same bits, the counters say what an uncompressed all-reduce
would have sent against what was sent, and `"allgather_compress": false` opts out. Real gloo
groups of 2 and 3 ranks."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import fsdpcomp
from helpers.dist_utils import run_ranks
from helpers.method_cases import compressing_codecs

STEPS = 4


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))


def _data(rank, steps):
    g = torch.Generator().manual_seed(300 + rank)
    return [(torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)) for _ in range(steps)]


def _train(model, rank, state_of, steps=STEPS, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in _data(rank, steps):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return state_of().counters()


def _params(model):
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _ddp(rank, world, method, config):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model())
    state = fsdpcomp.register(model, method, config)
    return _params_after(model, rank, lambda: state), state.config


def _params_after(model, rank, state_of):
    c = _train(model, rank, state_of)
    return _params(model), dict(c)


def _no_shard(rank, world, method, config):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    model = FSDP(_model(), sharding_strategy=ShardingStrategy.NO_SHARD, device_id=torch.device("cpu"),
                 use_orig_params=True)
    state = fsdpcomp.register(model, method, config)
    return _params_after(model, rank, lambda: state), state.config


def _replicas(rank, world, method, config):
    """FSDP2 on a 1-D shard mesh of one rank, the replica mean over all ranks by AllReduceHook."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    model = _model()
    for i in (0, 2, 4):
        fully_shard(model[i], mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    state = fsdpcomp.CommState(method, config, process_group=mesh["replicate"].get_group())
    fsdpcomp.register_replicate(model, state)
    return _params_after(model, rank, lambda: state), state.config


WRAPPERS = {"ddp": _ddp, "fsdp1_no_shard": _no_shard, "fsdp2_replicas": _replicas}


def _every_wrapper(rank, world):
    out = {}
    for name, fn in WRAPPERS.items():
        for label, config in (("default", {"block_size": 64}),
                              ("opt_out", {"block_size": 64, "allgather_compress": False})):
            out[name, label] = fn(rank, world, "int8", config)
    return out


@pytest.fixture(scope="module", params=[2, 3])
def int8_runs(request):
    return request.param, run_ranks(_every_wrapper, request.param)


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_int8_all_reduce_compresses_both_halves(int8_runs, wrapper):
    world, results = int8_runs
    (params, c), config = results[0][wrapper, "default"]
    assert config["allgather_compress"] is True  # the default
    assert c["ratio"] >= 3.5, c["ratio"]  # was ~1.6: the all-gather half went uncompressed
    (_, off), off_config = results[0][wrapper, "opt_out"]
    assert off_config["allgather_compress"] is False and 1.5 < off["ratio"] < 1.7, off["ratio"]
    # same traffic asked of both: what an uncompressed all-reduce would have sent
    assert c["bytes_raw"] == off["bytes_raw"]
    for rank, other in enumerate(results):  # replicas bit-identical, with and without
        for label in ("default", "opt_out"):
            mine = other[wrapper, label][0][0]
            assert all(torch.equal(a, b) for a, b in zip(mine, results[0][wrapper, label][0][0])), (rank, label)
        assert other[wrapper, "default"][0][1]["fallback_units"] == 0


def _counted(rank, world, method, numel, config):
    """One all-reduce (fsdp_hook's NO_SHARD meaning) of a known size, counted from zero."""
    g = torch.randn(numel, generator=torch.Generator().manual_seed(7 + rank))
    state = fsdpcomp.CommState(method, config)
    state.process_group = dist.group.WORLD
    fsdpcomp.fsdp_hook(state, g)
    return g, dict(state.counters()), state._core.payload_bytes(-(-numel // world))


@pytest.mark.parametrize("world", [2, 3])
def test_counters_are_both_halves_of_an_honest_all_reduce(world):
    numel = 5000 * world + 1  # the last chunk short
    shard = -(-numel // world)
    results = run_ranks(_counted, world, "int8", numel, {"block_size": 64})
    for rank, (g, c, gather_payload) in enumerate(results):
        assert torch.equal(g, results[0][0])
        own = min(numel, (rank + 1) * shard) - rank * shard
        # an uncompressed all-reduce: the reduce-scatter half sends every chunk but the own one,
        # the all-gather half the (padded) own shard to every other rank; fp32
        assert c["bytes_raw"] == 4 * ((numel - own) + (world - 1) * shard)
        # what was sent: int8 payloads (header, codes, a scale per 64) of the other ranks' chunks,
        # then this rank's shard as one payload to every other rank, and the ranks' handshake
        # before the first exchange (an 8-byte digest to every other rank)
        chunks = [min(numel, (k + 1) * shard) - k * shard for k in range(world)]
        rs_payloads = [-(-(32 + n + 4 * -(-n // 64)) // 16) * 16 for n in chunks]
        sent_rs = sum(p for k, p in enumerate(rs_payloads) if k != rank)
        assert c["bytes_sent"] == sent_rs + (world - 1) * gather_payload + 8 * (world - 1)
        assert c["ratio"] > 3.7  # 32 / (8 + 32/64) = 3.76, less the headers


def _every_method(rank, world):
    """Every method at its defaults through DDP: replicas must hold the same bits."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    for method in compressing_codecs():
        model = DDP(_model())
        state = fsdpcomp.register(model, method)
        c = _train(model, rank, lambda: state, steps=3, lr=0.01)
        out[method] = (_params(model), dict(c))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_method_keeps_replicas_identical(world):
    results = run_ranks(_every_method, world)
    for method in compressing_codecs():
        params, c = results[0][method]
        assert all(torch.isfinite(p).all() for p in params), method
        for other in results[1:]:
            assert all(torch.equal(a, b) for a, b in zip(params, other[method][0])), method
        assert c["bytes_sent"] <= results[0]["none"][1]["bytes_sent"], method  # never more than none
        if method != "none":  # thresholdv's default threshold passes most of these gradients
            assert c["ratio"] > (1.0 if method == "thresholdv" else 1.5), (method, c["ratio"])


def _thresholdv(rank, world, scale):
    """thresholdv through the all-reduce: its payload size is data-dependent, so the ranks learn
    the largest first; dense gradients (most values pass) go back uncompressed instead."""
    n = 4000 * world
    g = torch.randn(n, generator=torch.Generator().manual_seed(rank)) * scale
    state = fsdpcomp.CommState("thresholdv", {"threshold": 1.0})
    state.process_group = dist.group.WORLD
    fsdpcomp.fsdp_hook(state, g)
    return g, dict(state.counters())


@pytest.mark.parametrize("world", [2, 3])
def test_data_dependent_gather_sizes(world):
    sparse = run_ranks(_thresholdv, world, 0.5)  # ~5% pass: compressed both ways
    dense = run_ranks(_thresholdv, world, 1000.0)  # nearly all pass: raw shards cost less
    for results, fell_back in ((sparse, 0), (dense, 2)):
        for g, c in results:
            assert torch.equal(g, results[0][0])
            # dense: the reduce-scatter's payloads went as `none`, and the gather uncompressed
            assert c["fallback_units"] == fell_back
            # a size exchange for the reduce-scatter and one for the gather (which decides by
            # it), and the ranks' handshake before the first exchange
            assert c["extra_collectives"] == 3
    assert sparse[0][1]["ratio"] > 3 and dense[0][1]["ratio"] <= 1.0


def test_second_round_keeps_the_plain_all_gather():
    """A sketch with a second round decodes from all payloads together, never one alone: its
    all-gather half stays uncompressed by default, and asking for both is refused."""
    state = fsdpcomp.CommState("sketch", {"second_round": True})
    assert state.config["allgather_compress"] is False
    assert fsdpcomp.CommState("sketch").config["allgather_compress"] is True
    with pytest.raises(ValueError, match="'allgather_compress' cannot be combined with 'second_round'"):
        fsdpcomp.CommState("sketch", {"second_round": True, "allgather_compress": True})
