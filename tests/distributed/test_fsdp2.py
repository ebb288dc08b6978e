"""FSDP2 (fully_shard) on gloo/CPU with fsdpcomp.ReduceScatter: equal to torch's own
reduce-scatter with `none` for every reduce op FSDP2 passes, training with lossy methods, counters,
residual keying and bad input. One spawn per world size runs every scenario (spawns are slow)."""
import pytest
import torch
import torch.distributed as dist

import fsdpcomp
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy  # noqa: E402

STEPS = 3
# `none` sends fp32 exactly; the sum is the same set of fp32 numbers added in rank order by
# fsdpcomp and in gloo's order by torch, then divided (AVG) or scaled (SUM/PREMUL_SUM: fsdpcomp
# forms the mean and multiplies back). That is a few ulp per element per step; over 3 SGD steps
# of O(1) parameters 1e-6 absolute covers it with margin. fp16 reduce: fp16 rounding, 2e-3.
TOL = {torch.float32: 1e-6, torch.float16: 2e-3}


def _model(seed):
    torch.manual_seed(seed)
    # 7 and 9 rows: padded shards for 2 and 3 ranks; three FSDP units plus a root with params.
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 9),
                               torch.nn.Tanh(), torch.nn.Linear(9, 4), torch.nn.LayerNorm(4))


def _shard(model, reduce_dtype=None, divide_factor=None, force_sum=False):
    mp = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    for i in (0, 2, 4):
        fully_shard(model[i], mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    if divide_factor is not None:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(divide_factor)
                m.set_force_sum_reduction_for_comms(force_sum)
    return model


def _data(rank, steps):
    g = torch.Generator().manual_seed(1000 + rank)
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(7))  # the same target on all ranks
    xs = [torch.randn(16, 6, generator=g) for _ in range(steps)]
    return [(x, torch.tanh(x @ w)) for x in xs]


def _train(rank, steps, method=None, config=None, reduce_dtype=None, divide_factor=None,
           force_sum=False, lr=0.05):
    model = _shard(_model(0), reduce_dtype, divide_factor, force_sum)
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
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return params, losses, state


def _bad_inputs(rank, world):
    """Each bad call raises a clear error and leaves the counters as they were."""
    state = fsdpcomp.CommState("int8")
    rs = fsdpcomp.ReduceScatter(state, key="direct")
    out, inp = torch.empty(5), torch.randn(5 * world)
    errors = []
    cases = [
        ("op", lambda: rs(out, inp, dist.group.WORLD, dist.ReduceOp.MAX)),
        ("size", lambda: rs(torch.empty(4), inp, dist.group.WORLD, dist.ReduceOp.AVG)),
        ("dtype", lambda: rs(out.to(torch.float64), inp.to(torch.float64), dist.group.WORLD, dist.ReduceOp.AVG)),
        ("mixed", lambda: rs(out.half(), inp, dist.group.WORLD, dist.ReduceOp.AVG)),
        ("shape", lambda: rs(out, inp.view(world, 5), dist.group.WORLD, dist.ReduceOp.AVG)),
        ("premul", lambda: rs(out, inp, dist.group.WORLD, dist.ReduceOp.PREMUL_SUM)),
    ]
    for name, call in cases:
        try:
            call()
            errors.append((name, None, ""))
        except (ValueError, TypeError) as e:
            errors.append((name, type(e).__name__, str(e)))
    # A good call afterwards still works: nothing was half-claimed by the bad ones.
    rs(out, inp, dist.group.WORLD, dist.ReduceOp.AVG)
    work = rs(out, inp, dist.group.WORLD, dist.ReduceOp.AVG, async_op=True)
    work.wait()
    return errors, dict(state.counters()), own(state.state_dict()).unit_keys


def _scenarios(rank, world):
    res = {}
    for name, kw in {"avg": {}, "premul": {"divide_factor": 5.0}, "sum_fp16": {"reduce_dtype": torch.float16}}.items():
        # gloo has no PREMUL_SUM: torch's reference for a divide factor is then SUM + post-divide
        base, _, _ = _train(rank, STEPS, force_sum="divide_factor" in kw, **kw)
        mine, _, state = _train(rank, STEPS, "none", **kw)
        res[name] = (base, mine, dict(state.counters()), own(state.state_dict()).unit_keys)
    lossy = {"int8": {"block_size": 64}}
    if "topk" in fsdpcomp.methods():
        lossy["topk"] = {"ratio": 0.25, "error_feedback": True}
    for method, config in lossy.items():
        _, losses, state = _train(rank, 40, method, config, lr=0.2)
        res[method] = (losses, dict(state.counters()))
    res["bad"] = _bad_inputs(rank, world)
    return res


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return request.param, run_ranks(_scenarios, request.param)


@pytest.mark.parametrize("case", ["avg", "premul", "sum_fp16"])
def test_none_equals_torch_reduce_scatter(ranks, case):
    world, results = ranks
    for rank, res in enumerate(results):
        base, mine, ctr, keys = res[case]
        tol = TOL[torch.float16 if case == "sum_fp16" else torch.float32]
        for b, m in zip(base, mine):
            assert torch.allclose(b, m, atol=tol, rtol=0), (rank, (b - m).abs().max().item())
        assert ctr["calls"] == STEPS * 4  # three Linear units + the root (LayerNorm)
        assert ctr["bytes_sent"] > 0 and ctr["elements"] > 0
        # one unit per group, keyed by the module's name, in the same order on every rank
        assert sorted(keys) == ["0", "2", "4", "<root>"] and keys == results[0][case][3]


@pytest.mark.parametrize("method", ["int8", "topk"])
def test_lossy_methods_train(ranks, method):
    world, results = ranks
    if method not in results[0]:
        pytest.skip(f"{method} is not in fsdpcomp.methods()")
    losses, ctr = results[0][method]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    assert ctr["calls"] == 40 * 4
    assert ctr["bytes_sent"] < ctr["bytes_raw"]  # compressed payloads, headers included
    assert ctr["step"] == 40


def test_bad_input_is_refused(ranks):
    world, results = ranks
    errors, ctr, keys = results[0]["bad"]
    for name, kind, msg in errors:
        assert kind is not None, f"bad input '{name}' was accepted"
    text = dict((n, m) for n, _, m in errors)
    assert "MAX" in text["op"] and "needs" in text["size"] and "float64" in text["dtype"]
    # only the two good calls counted: one unit, its key claimed again, so a second step
    assert ctr["calls"] == 2 and ctr["step"] == 1 and keys == ["direct"]


def test_units_follow_their_keys_whatever_the_order(gen):
    """Keyed units keep their residual when the order of the calls changes (one process, no
    process group: a world of one loops its own payload back)."""
    state = fsdpcomp.CommState("topk", {"ratio": 0.1, "compress_own_chunk": True})
    a, b = fsdpcomp.ReduceScatter(state, key="a"), fsdpcomp.ReduceScatter(state, key="b")
    alone = {k: fsdpcomp.CommState("topk", {"ratio": 0.1, "compress_own_chunk": True}) for k in "ab"}
    xs = [(torch.randn(64, generator=gen), torch.randn(64, generator=gen)) for _ in range(3)]
    for step, (x, y) in enumerate(xs):
        order = [(a, "a", x), (b, "b", y)] if step % 2 == 0 else [(b, "b", y), (a, "a", x)]
        for rs, key, g in order:
            out, ref = torch.empty(64), torch.empty(64)
            rs(out, g)
            fsdpcomp.ReduceScatter(alone[key])(ref, g)
            alone[key].end_step()
            assert torch.equal(out, ref), (step, key)
    assert state.step == 2 and own(state.state_dict()).unit_keys == ["a", "b"]


def test_register_refuses_unknown_models():
    with pytest.raises(TypeError, match="does not know how to attach to Linear"):
        fsdpcomp.register(torch.nn.Linear(2, 2), "none")
    with pytest.raises(TypeError, match="CommState"):
        fsdpcomp.ReduceScatter("int8")


def _hybrid(rank, world):
    """2 ranks as 2 replicas x 1 shard: fully_shard on the 1-D shard mesh, the replica mean by
    fsdpcomp.register_replicate. Reference: plain FSDP2 over both ranks (the same mean)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    ref, _, _ = _train(rank, STEPS)
    model = _model(0)
    for i in (0, 2, 4):
        fully_shard(model[i], mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    state = fsdpcomp.CommState("none", process_group=mesh["replicate"].get_group())
    fsdpcomp.register_replicate(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _data(rank, STEPS):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    mine = [p.full_tensor().detach().clone() for p in model.parameters()]
    # torch's own 2-D HSDP has no hook for its replica all-reduce: registering is refused
    hsdp = _model(0)
    fully_shard(hsdp, mesh=mesh)
    try:
        fsdpcomp.register_replicate(hsdp, fsdpcomp.CommState("none", process_group=mesh["replicate"].get_group()))
        refused = None
    except ValueError as e:
        refused = str(e)
    return ref, mine, dict(state.counters()), refused


def test_hybrid_sharding_replica_all_reduce():
    for rank, (ref, mine, ctr, refused) in enumerate(run_ranks(_hybrid, 2)):
        for b, m in zip(ref, mine):
            assert torch.allclose(b, m, atol=TOL[torch.float32], rtol=0), (rank, (b - m).abs().max().item())
        assert ctr["calls"] == STEPS * 4 and ctr["step"] == STEPS
        assert refused is not None and "2-D (HSDP) mesh" in refused
