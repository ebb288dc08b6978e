"""CommState checkpoints (format 2): a load that does not fit this rank (another world size,
another rank's state, other units, a format this fsdpcomp does not read) is refused with a
ValueError naming the difference and changes nothing; residuals="drop" resumes on purpose; the
dict goes through torch.save and torch.load's default (weights_only) unchanged."""
import io
import json

import pytest
import torch

import fsdpcomp
import fsdpcomp._alloc
from fsdpcomp import _C
from helpers.ckpt import own

CFG = {"error_feedback": True, "compress_own_chunk": True, "block_size": 16}


def _ran(n=256, key="a", steps=2, seed=0):
    s = fsdpcomp.CommState("int8", CFG)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        s.reduce_scatter(torch.randn(n, generator=g), torch.empty(n), key)
        s.end_step()
    return s


def _summary(s):
    sd = s.state_dict()
    return sd["step"], own(sd).units, own(sd).unit_keys, [r.clone() for r in own(sd).residuals["scatter"]]


def _same(a, b):
    return a[:3] == b[:3] and all(torch.equal(x, y) for x, y in zip(a[3], b[3]))


def test_round_trip_through_torch_save_with_weights_only():
    s = _ran()
    buf = io.BytesIO()
    torch.save({"fsdpcomp": s.state_dict()}, buf)
    buf.seek(0)
    sd = torch.load(buf)["fsdpcomp"]  # torch.load's default: weights_only=True
    t = fsdpcomp.CommState("int8", CFG)
    t.load_state_dict(sd)
    assert _same(_summary(t), _summary(s)) and t.step == 2
    assert sd["format"] == 3 and sd["world_size"] == 1 and own(sd).unit_keys == ["a"]


@pytest.mark.parametrize("change,pattern", [
    (lambda sd: dict(sd, world_size=4), r"saved at world size 4, this run has 1 ranks.*residuals=\"drop\""),
    (lambda sd: {("rank3" if k == "rank0" else k): v for k, v in sd.items()},
     r"holds the state of rank3, this is rank 0.*each rank loads its own"),
    (lambda sd: _ran(512).state_dict(), r"unit 'a' has 512 elements, this state's has 256: a checkpoint of other units"),
    (lambda sd: _ran(key=None).state_dict(), r"unit 0 \(call order\) has 256 elements, this state's has 128"),
    (lambda sd: dict(sd, format=4), r"format 4; this fsdpcomp reads format 3"),
    (lambda sd: {k: v for k, v in sd.items() if k not in ("format", "world_size")}, r"no 'format' key.*fsdpcomp 0.1"),
    (lambda sd: dict(sd, config=sd["config"].replace('"block_size": 16', '"block_size": 32')),
     r"config differs from this state's in \{'block_size': \(32, 16\)\}"),
    (lambda sd: dict(sd, method="int4"), r"for method 'int4', this state is 'int8'"),
])
def test_a_load_that_does_not_fit_is_refused_by_name_and_changes_nothing(change, pattern):
    s = _ran(n=128, key=None, seed=1) if "call order" in pattern else _ran(seed=1)
    before = _summary(s)
    with pytest.raises(ValueError, match=pattern):
        s.load_state_dict(change(_ran(seed=2).state_dict()))
    assert _same(_summary(s), before)


def test_a_residual_of_another_dtype_is_refused_by_torchs_name_for_it():
    """The message names the dtype as the user knows it (float64), not DLPack's code triple."""
    s = _ran(seed=1)
    before = _summary(s)
    sd = _ran(seed=2).state_dict()
    own(sd).residuals["scatter"][0] = own(sd).residuals["scatter"][0].double()
    with pytest.raises(TypeError, match=r"residuals\['scatter'\]\[0\] must be float32, got float64$"):
        s.load_state_dict(sd)
    assert _same(_summary(s), before)


def test_a_fresh_state_meets_other_units_at_its_first_call():
    s = fsdpcomp.CommState("int8", CFG)
    s.load_state_dict(_ran(256).state_dict())
    with pytest.raises(ValueError, match="unit key 'a'"):
        s.reduce_scatter(torch.randn(512), torch.empty(512), "a")
    assert s.step == 2


def test_drop_keeps_method_config_and_step_and_starts_the_residuals_afresh():
    sd = dict(_ran().state_dict(), world_size=2)  # as saved by a run of 2 ranks
    sd["rank1"] = sd.pop("rank0")
    s = _ran(seed=3)
    s.load_state_dict(sd, residuals="drop")
    assert s.step == 2 and s.unit_keys == () and own(s.state_dict()).residuals["scatter"] == []
    out = torch.empty(256)
    s.reduce_scatter(torch.randn(256), out, "a")  # the first call claims the unit afresh
    assert s.unit_keys == ("a",) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="for method 'int8', this state is 'none'"):
        fsdpcomp.CommState("none").load_state_dict(sd, residuals="drop")  # the config still must fit
    with pytest.raises(ValueError, match=r"residuals must be \"keep\" or \"drop\", got 'all'"):
        s.load_state_dict(sd, residuals="all")


def test_a_checkpoint_that_lists_a_removed_key_loads():
    """Checkpoints hold the resolved config; those written while transport and timeout_s were
    common keys list them, and they never changed what a residual means."""
    s = _ran()
    sd = s.state_dict()
    sd["config"] = json.dumps(dict(json.loads(sd["config"]), transport="auto", timeout_s=0), sort_keys=True)
    t = fsdpcomp.CommState("int8", CFG)
    t.load_state_dict(sd)
    assert _same(_summary(t), _summary(s))


def test_drop_reads_a_format_1_checkpoint():
    old = {"method": "int8", "config": fsdpcomp.CommState("int8", CFG).config, "step": 7, "units": [256],
           "residuals": [torch.zeros(256)]}
    s = fsdpcomp.CommState("int8", CFG)
    s.load_state_dict(old, residuals="drop")
    assert s.step == 7 and s.unit_keys == ()


def test_without_residuals_is_the_dcp_view_that_drops():
    s = _ran()
    view = s.without_residuals()
    sd = view.state_dict()
    assert not any(k.startswith("rank") for k in sd) and sd["step"] == 2
    t = fsdpcomp.CommState("int8", CFG)
    t.without_residuals().load_state_dict(dict(sd, world_size=8))
    assert t.step == 2 and t.unit_keys == ()


def test_a_checkpoint_from_before_a_common_key_existed_loads_at_its_default():
    # checkpoints written before ef_decay (2026-11-28) do not list it: at its default (1.0) the
    # run is the one that saved them; at another value it is not, and is refused by name
    state = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True})
    state.reduce_scatter(torch.randn(300), torch.empty(300))
    state.end_step()
    sd = state.state_dict()
    old = dict(sd, config=json.dumps({k: v for k, v in json.loads(sd["config"]).items() if k != "ef_decay"}))
    fresh = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True})
    fresh.load_state_dict(old)
    assert torch.equal(fresh._core.residuals()[0], state._core.residuals()[0])
    decayed = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True, "ef_decay": 0.5})
    with pytest.raises(ValueError, match="ef_decay"):
        decayed.load_state_dict(old)


@pytest.mark.parametrize("residual_dtype", ["fp32", "int8"])
def test_a_restored_residual_moves_into_the_states_memory_at_its_first_call(residual_dtype):
    """restore() keeps the checkpoint's tensors as they come, on the device they were saved from
    (a GPU's, when a run resumes on the CPU, or the other way); the unit's first call moves its
    residual into a tensor the State's allocator makes like that call's grad (on its device),
    once: the run goes on as the uninterrupted one, the checkpoint's tensor is never written, and
    residual_bytes counts the unit once. (On a GPU machine tests/cuda/test_cuda_sparse.py loads a
    device checkpoint into a CPU state; here both sides are the CPU, and the allocator's
    arguments show where the residual went.)"""
    cfg = {"error_feedback": True, "block_size": 16, "residual_dtype": residual_dtype}
    made = []

    def allocate(numel, dtype_name, like):  # fsdpcomp's own allocator, its calls written down
        made.append((numel, dtype_name, like.device))
        return fsdpcomp._alloc.allocate(numel, dtype_name, like)

    def step(st, g):
        u = st.begin(g.numel())
        sizes, _ = st.plan(g, 1, 0)
        send = torch.zeros(sum(sizes), dtype=torch.uint8)
        st.encode(g, send, 1, 0, u)
        st.end_step()
        return send

    gen = torch.Generator().manual_seed(4)
    grads = [torch.randn(300, generator=gen) for _ in range(4)]
    a = _C.State("int8", cfg, fsdpcomp._alloc.allocate)
    for g in grads[:2]:
        step(a, g)
    saved = [r.clone() for r in a.residuals()]
    b = _C.State("int8", cfg, allocate)
    b.restore(a.units(), saved, a.step)
    assert b.residuals()[0] is saved[0] and made == []  # kept as given until the unit's call
    stored = (b.residual_numel(300), "uint8" if residual_dtype == "int8" else "float32", torch.device("cpu"))
    kept = saved[0].clone()
    for i, g in enumerate(grads[2:]):
        assert torch.equal(step(b, g), step(a, g)), f"step {i}: the resumed payload differs"
        assert torch.equal(b.residuals()[0], a.residuals()[0]), f"step {i}: residuals differ"
        assert made.count(stored) == 1, f"step {i}: the residual was allocated {made.count(stored)} times"
        assert b.residuals()[0] is not saved[0] and torch.equal(saved[0], kept)
        assert b.counters()["residual_bytes"] == stored[0] * (1 if residual_dtype == "int8" else 4)
