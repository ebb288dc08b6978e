"""FSDP2's parameter all-gather through fsdpcomp.AllGather on gloo/CPU: `none` is bit-identical to
torch's own, int8 gathers train and give every rank (and both gathers of a step) the same weights,
bf16 parameters, exact byte counters, and the refusals (FSDP1, DDP, bad input). One spawn per
world size runs every scenario (spawns are slow)."""
import pytest
import torch
import torch.distributed as dist

import fsdpcomp
from helpers.dist_utils import run_ranks

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard
from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: E402

STEPS = 3
TRAIN_STEPS = 30
INT8 = {"block_size": 64, "param_gather": "int8", "param_gather_block_size": 64}


class Normed(torch.nn.Module):
    """LayerNorm then a Linear with small weights: in one flat shard, the gain (ones) lies right
    before weights a hundred times smaller, as in a transformer block."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.norm, self.lin = torch.nn.LayerNorm(n_in), torch.nn.Linear(n_in, n_out)
        with torch.no_grad():
            self.lin.weight.mul_(0.05)

    def forward(self, x):
        return self.lin(self.norm(x))


def _model(seed):
    torch.manual_seed(seed)
    # three FSDP units whose shards span several 64-element blocks, and a root with parameters
    return torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(), Normed(48, 40),
                               torch.nn.Tanh(), torch.nn.Linear(40, 6), torch.nn.LayerNorm(6))


def _segments(model, world):
    """Per unit (register's numbering), each parameter's padded shard size in FSDP2's order,
    from the parameters' shapes: where a segment of the flat shard starts and ends."""
    out = []
    for _, module in _modules(model):
        inner = {id(p) for m in module.modules() if m is not module and hasattr(m, "_get_fsdp_state")
                 for p in m.parameters()}
        out.append([-(-p.shape[0] // world) * (p[0].numel() if p.dim() > 1 else 1)
                    for p in module.parameters() if id(p) not in inner])
    return out


def _shard(model, param_dtype=None):
    mp = MixedPrecisionPolicy(param_dtype=param_dtype)
    for i in (0, 2, 4):
        fully_shard(model[i], mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # reshard_after_forward=True: every unit gathers twice a step
    return model


def _modules(model):
    return fsdpcomp.integrations.fsdp2_modules(model)


def _data(rank, steps):
    g = torch.Generator().manual_seed(1000 + rank)
    w = torch.randn(12, 6, generator=torch.Generator().manual_seed(7))  # the same target on all ranks
    xs = [torch.randn(16, 12, generator=g) for _ in range(steps)]
    return [(x, torch.tanh(x @ w)) for x in xs]


class Recorder:
    """Wraps a module's all-gather and keeps (unit, its input, its output) of every call. The
    input is a view of the output (FSDP copies the shard in there), so it is copied first."""

    def __init__(self, inner, unit, calls):
        self.inner, self.unit, self.calls = inner, unit, calls

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group=None, async_op=False):
        shard = input_tensor.clone()
        work = self.inner(output_tensor=output_tensor, input_tensor=input_tensor, group=group, async_op=async_op)
        self.calls.append((self.unit, shard, output_tensor.clone()))
        return work


def _record(model):
    """Records every gather of the all-gathers installed now (torch's default or fsdpcomp's)."""
    calls = []
    for unit, (_, module) in enumerate(_modules(model)):
        group = module._get_fsdp_state()._fsdp_param_groups[0]
        module.set_custom_all_gather(Recorder(group._all_gather_comm, unit, calls))
    return calls


def _train(rank, steps, setup, lr=0.05, param_dtype=None):
    """setup(model) attaches whatever the run compares and returns the state (or None)."""
    model = _shard(_model(0), param_dtype)
    state = setup(model)
    calls = _record(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, per_step = [], []
    segments = _segments(model, dist.get_world_size())
    for x, y in _data(rank, steps):
        start = len(calls)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        per_step.append(calls[start:])
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / dist.get_world_size())
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return params, losses, state, (per_step, segments)


def _gathers_only(model, config):
    """fsdpcomp's AllGather alone (torch's own reduce-scatter), numbered as register does."""
    state = fsdpcomp.CommState("none", config)
    for unit, (name, module) in enumerate(_modules(model)):
        module.set_custom_all_gather(fsdpcomp.AllGather(state, key=name, unit=unit))
    return state


def _reduce_scatter_only(model, method, config):
    state = fsdpcomp.CommState(method, config)
    for name, module in _modules(model):
        module.set_custom_reduce_scatter(fsdpcomp.ReduceScatter(state, key=name or "<root>"))
    return state


def _summary(recorded, state):
    """What the test checks, small enough to send back: per step, whether each unit's gathers
    gave the same bits; the first and last step's outputs with each unit's segments; counters
    and the expected bytes (one payload per parameter segment)."""
    per_step, segments = recorded
    codec = state.param_codec if state is not None else None
    same, expect_sent, expect_raw = [], 0, 0
    world = dist.get_world_size()
    for calls in per_step:
        by_unit = {}
        for unit, shard, out in calls:
            by_unit.setdefault(unit, []).append(out)
            n = shard.numel()
            assert sum(segments[unit]) == n
            expect_raw += (world - 1) * n * shard.element_size()
            expect_sent += (world - 1) * (sum(codec.payload_bytes(k) for k in segments[unit]) if codec
                                          else n * shard.element_size())
        same.append(all(all(torch.equal(o, outs[0]) for o in outs) for outs in by_unit.values()))
    first = [(u, s, o, segments[u]) for u, s, o in per_step[0]]
    last = [o for _, _, o in per_step[-1]]
    return {"same_within_step": same, "first": first, "last": last, "gathers_per_step": [len(c) for c in per_step],
            "counters": dict(state.counters()) if state is not None else None,
            "expect_sent": expect_sent, "expect_raw": expect_raw}


def _refusals(rank, world):
    """FSDP1 and DDP asked for parameter gathers: ValueError, and nothing was registered."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    fsdp1 = FSDP(_model(0), device_id=torch.device("cpu"))
    try:
        fsdpcomp.register(fsdp1, "int8", {"param_gather": "int8"})
        out["fsdp1"] = None
    except ValueError as e:
        out["fsdp1"] = str(e)
    out["fsdp1_hook"] = fsdp1._comm_hook
    ddp = DDP(_model(0))
    try:
        fsdpcomp.register(ddp, fsdpcomp.CommState("int8", {"param_gather": "fp8"}))
        out["ddp"] = None
    except ValueError as e:
        out["ddp"] = str(e)
    fsdpcomp.register(ddp, "int8")  # DDP takes one comm hook only: this raises if one was registered
    return out


def _unit_mismatch(rank, world):
    """Ranks gathering different modules at once: the headers disagree, PayloadError."""
    state = fsdpcomp.CommState("none", {"param_gather": "int8"})
    gather = fsdpcomp.AllGather(state, key="x", unit=rank)
    shard = torch.randn(100)
    try:
        gather(torch.empty(100 * world), shard, dist.group.WORLD)
        return None
    except fsdpcomp.PayloadError as e:
        return str(e)


def _scenarios(rank, world):
    res = {}
    # `none`: torch's own all-gather, through fsdpcomp.AllGather, against plain FSDP2
    res["plain"] = _train(rank, STEPS, lambda m: None)[0]
    params, _, state, per_step = _train(rank, STEPS, lambda m: _gathers_only(m, {}))
    res["none"] = (params, _summary(per_step, state))
    # the same through register(): int8 gradients with and without fsdpcomp's all-gather
    res["rs_only"] = _train(rank, STEPS, lambda m: _reduce_scatter_only(m, "int8", {"block_size": 64}))[0]
    params, _, state, _ = _train(rank, STEPS, lambda m: fsdpcomp.register(m, "int8", {"block_size": 64}))
    res["register_none"] = (params, dict(state.counters()))
    # int8 gathers (and int8 gradients) train; every rank and both gathers of a step agree
    params, losses, state, per_step = _train(rank, TRAIN_STEPS, lambda m: fsdpcomp.register(m, "int8", INT8), lr=0.2)
    res["int8"] = (params, losses, _summary(per_step, state))
    # bf16 parameters: the bf16 codec is lossless on them (equal to plain bf16 FSDP2); int8 trains
    bf16 = torch.bfloat16
    res["plain_bf16"] = _train(rank, STEPS, lambda m: None, param_dtype=bf16)[0]
    res["bf16_codec"] = _train(rank, STEPS, lambda m: _gathers_only(m, {"param_gather": "bf16"}), param_dtype=bf16)[0]
    params, losses, state, per_step = _train(rank, TRAIN_STEPS, lambda m: fsdpcomp.register(m, "int8", INT8),
                                             lr=0.2, param_dtype=bf16)
    res["int8_bf16"] = (params, losses, _summary(per_step, state))
    res["refusals"] = _refusals(rank, world)
    res["mismatch"] = _unit_mismatch(rank, world)
    return res


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return request.param, run_ranks(_scenarios, request.param)


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_none_is_torchs_all_gather_bit_for_bit(ranks):
    world, results = ranks
    for rank, res in enumerate(results):
        params, summary = res["none"]
        assert _equal(res["plain"], params), rank
        # with register(): the int8 reduce-scatter alone, and with the `none` all-gather added
        params, ctr = res["register_none"]
        assert _equal(res["rs_only"], params), rank
        assert ctr["param_gather_calls"] == STEPS * 7  # 3 units gather twice a step, the root once
        assert summary["gathers_per_step"] == [7] * STEPS
        c = summary["counters"]
        assert c["param_gather_bytes_sent"] == c["param_gather_bytes_raw"] == summary["expect_raw"] > 0
        assert c["param_gather_codec_time_s"] == 0 and c["param_gather_time_s"] > 0


@pytest.mark.parametrize("case", ["int8", "int8_bf16"])
def test_int8_gathers_train_with_identical_weights(ranks, case):
    world, results = ranks
    dtype = torch.bfloat16 if case == "int8_bf16" else torch.float32
    _, losses, s0 = results[0][case]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    for rank, res in enumerate(results):
        params, _, s = res[case]
        assert _equal(results[0][case][0], params), rank  # the master weights agree, as always
        # forward gather and backward re-gather of each unit: the same bits, every step
        assert all(s["same_within_step"]), (rank, s["same_within_step"])
        # every rank computes with the same weights
        assert _equal([f[2] for f in s0["first"]], [f[2] for f in s["first"]]), rank
        assert _equal(s0["last"], s["last"]), rank
        errors = []
        for unit, shard, out, segments in s["first"]:
            assert out.dtype == dtype
            n = shard.numel()
            mine, exact = out[rank * n:(rank + 1) * n].float(), shard.float()
            # the owner computes with the decode of its shard, not with the shard; each parameter
            # has scales of its own: half a step of its own largest value (a block spanning the
            # LayerNorm gain and the small weights after it would give them a step of 1/127)
            at = 0
            for k in segments:
                scale = exact[at:at + k].abs().max().item()
                errors.append((mine[at:at + k] - exact[at:at + k]).abs().max().item())
                bound = scale / 254 * 1.001 + (scale / 256 if dtype == torch.bfloat16 else 0)
                assert errors[-1] <= bound, (unit, at, k, errors[-1], scale)
                at += k
        assert max(errors) > 0  # the LayerNorms (ones, zeros) are exact; the Linear weights are not


@pytest.mark.parametrize("case", ["int8", "int8_bf16"])
def test_counters_are_the_payload_bytes(ranks, case):
    world, results = ranks
    elem = 2 if case == "int8_bf16" else 4
    for rank, res in enumerate(results):
        _, _, s = res[case]
        c = s["counters"]
        assert c["param_gather_calls"] == TRAIN_STEPS * 7
        assert c["param_gather_bytes_sent"] == s["expect_sent"]
        assert c["param_gather_bytes_raw"] == s["expect_raw"]
        assert c["param_gather_bytes_raw"] == sum((world - 1) * f[1].numel() * elem for f in s["first"]) * TRAIN_STEPS
        assert c["param_gather_bytes_sent"] < c["param_gather_bytes_raw"]
        assert 0 < c["param_gather_codec_time_s"] < c["param_gather_time_s"]
        # the gradient path's counters are the int8 reduce-scatter's alone, as without gathers
        # (its bytes_raw is in the gradients' dtype: bf16 in the bf16 run, so elements here)
        per_step = res["register_none"][1]

        def payloads(k):  # less the ranks' handshakes (8 bytes to each peer, once per shape)
            return k["bytes_sent"] - 8 * (world - 1) * k["extra_collectives"]

        assert payloads(c) * STEPS == payloads(per_step) * TRAIN_STEPS
        assert c["elements"] * STEPS == per_step["elements"] * TRAIN_STEPS


def test_bf16_codec_is_lossless_on_bf16_parameters(ranks):
    world, results = ranks
    for rank, res in enumerate(results):
        assert _equal(res["plain_bf16"], res["bf16_codec"]), rank


def test_fsdp1_and_ddp_refuse_param_gather(ranks):
    world, results = ranks
    out = results[0]["refusals"]
    for kind, codec in (("fsdp1", "int8"), ("ddp", "fp8")):
        assert out[kind] is not None and "'param_gather'" in out[kind] and f"'{codec}'" in out[kind], out[kind]
    assert "FullyShardedDataParallel" in out["fsdp1"] and "DistributedDataParallel" in out["ddp"]
    assert out["fsdp1_hook"] is None  # nothing was registered before the refusal


def test_ranks_gathering_different_units_get_a_payload_error(ranks):
    world, results = ranks
    for res in results:
        assert res["mismatch"] is not None and "unit" in res["mismatch"], res["mismatch"]


# ---- one process, no process group: a world of one decodes its own payload


@pytest.mark.parametrize("codec,tol", [("int8", 1 / 127), ("fp8", 1 / 16), ("bf16", 1 / 256)])
def test_one_rank_round_trip(gen, codec, tol):
    state = fsdpcomp.CommState("none", {"param_gather": codec, "param_gather_block_size": 64})
    gather = fsdpcomp.AllGather(state, unit=3)
    shard = torch.randn(1000, generator=gen)
    out = torch.empty(1000)
    gather(out, shard)
    err = (out - shard).abs().max().item()
    assert 0 < err <= tol * shard.abs().max().item()
    # the same bits as the codec's own round trip (nearest rounding: no randomness)
    payload = torch.empty(state.param_codec.payload_bytes(1000), dtype=torch.uint8)
    state.param_codec.compress(shard, payload, unit=3)
    ref = torch.zeros(1000)
    state.param_codec.decompress(payload, ref, unit=3)
    assert torch.equal(out, ref)
    assert state.counters()["param_gather_calls"] == 1 and state.counters()["param_gather_bytes_sent"] == 0


def test_bad_input_is_refused(gen):
    state = fsdpcomp.CommState("int8", {"param_gather": "int8"})
    gather = fsdpcomp.AllGather(state)
    shard = torch.randn(8, generator=gen)
    with pytest.raises(ValueError, match="needs 8"):
        gather(torch.empty(9), shard)
    with pytest.raises(TypeError, match="float64"):
        gather(torch.empty(8, dtype=torch.float64), shard.double())
    with pytest.raises(TypeError, match="share dtype"):
        gather(torch.empty(8, dtype=torch.bfloat16), shard)
    with pytest.raises(TypeError, match="CPU and CUDA tensors"):
        gather(torch.empty(8, device="meta"), torch.empty(8, device="meta"))
    with pytest.raises(TypeError, match="CommState"):
        fsdpcomp.AllGather("int8")
    with pytest.raises(ValueError, match="unit"):
        fsdpcomp.AllGather(state, unit=-1)
    assert state.counters()["param_gather_calls"] == 0  # nothing counted for a refused call
    for bad in ((-1.0, 0.0, 0, 0), (1.0, 2.0, 0, 0), (float("nan"), 0.0, 0, 0), (1.0, 0.0, -8, 0)):
        with pytest.raises(ValueError, match="add_param_gather"):
            state._core.add_param_gather(*bad)
    assert state.counters()["param_gather_calls"] == 0
    # `none` gathers whatever FSDP2 gathers (uint8 from all-gather extensions, too)
    fsdpcomp.AllGather(fsdpcomp.CommState())(torch.empty(8, dtype=torch.uint8), torch.arange(8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="'param_gather' must be one of"):
        fsdpcomp.CommState("int8", {"param_gather": "int4"})
    with pytest.raises(ValueError, match="param_gather_block_size"):
        fsdpcomp.CommState("int8", {"param_gather_block_size": 100})
    with pytest.raises(ValueError, match="'param_gather'.*register_replicate"):
        fsdpcomp.register_replicate(torch.nn.Linear(2, 2), state)


def test_results_line_carries_the_gather_counters(ranks):
    world, results = ranks
    per_rank = [res["int8"][2]["counters"] for res in results]
    c = fsdpcomp.combine_counters(per_rank)
    run = {"run_name": "r", "world_size": world, "model": "m", "dataset": "d", "max_length": 1, "batch_size": 16,
           "compress_method": "int8", "compress_config": INT8, "seed": 0, "train_loss": 1.0, "val_loss": None,
           "val_ppl": None}
    rec = fsdpcomp.build_record(run=run, step_times_s=[1.0] * TRAIN_STEPS, tokens_per_step=16, counters=c)
    assert rec["param_gather_calls"] == world * TRAIN_STEPS * 7
    assert rec["param_gather_bytes_sent_total"] == sum(p["param_gather_bytes_sent"] for p in per_rank)
    assert rec["param_gather_bytes_raw_total"] == sum(p["param_gather_bytes_raw"] for p in per_rank)
    assert rec["param_gather_ratio"] == pytest.approx(rec["param_gather_bytes_raw_total"] / rec["param_gather_bytes_sent_total"])
    # the gradient fields keep meaning the reduce-scatter alone
    assert rec["bytes_raw_total"] == sum(p["bytes_raw"] for p in per_rank)
    assert rec["compression_ratio"] == pytest.approx(c["bytes_raw"] / c["bytes_compressed"])
    mean_wire = sum(p["param_gather_time_s"] - p["param_gather_codec_time_s"] for p in per_rank) / world
    assert rec["comm_time_ms_by_op"]["all_gather"] == pytest.approx(mean_wire * 1e3)
    assert rec["param_gather_codec_time_ms"] == pytest.approx(
        sum(p["param_gather_codec_time_s"] for p in per_rank) / world * 1e3)
    # no gathers seen (FSDP1, DDP): null, not zero
    rec = fsdpcomp.build_record(run=run, step_times_s=[1.0], tokens_per_step=16,
                                counters=fsdpcomp.combine_counters([results[0]["register_none"][1] | {"param_gather_calls": 0}]))
    assert rec["param_gather_bytes_sent_total"] is None and rec["comm_time_ms_by_op"]["all_gather"] is None
