"""A refused call changes nothing: every public entry point (fsdp_hook, CommState's reduce_scatter
and all_reduce, ReduceScatter, AllReduceHook, ddp_hook, load_state_dict) checks all of its
arguments before it claims a unit or moves the step on, so retrying a refused call lands on the
same unit; and the errors are the documented ones: TypeError/ValueError naming the argument."""
import pytest
import torch
import torch.distributed as dist

import fsdpcomp
from helpers.ckpt import own, with_own
from helpers.dist_utils import run_ranks

N = 256


def _good(gen):
    return torch.randn(N, generator=gen)


def _state():
    return fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True})


def _same(a, b):
    """Two states that saw the same good calls hold the same step, units and residual bits."""
    sa, sb = a.state_dict(), b.state_dict()
    assert (sa["step"], own(sa).units, own(sa).unit_keys) == (sb["step"], own(sb).units, own(sb).unit_keys)
    assert all(torch.equal(x, y) for x, y in zip(own(sa).residuals["scatter"], own(sb).residuals["scatter"]))
    ca, cb = a.counters(), b.counters()
    assert (ca["calls"], ca["units"], ca["step"]) == (cb["calls"], cb["units"], cb["step"])


# (what, call(state, good_grad), exception, what the message names)
REDUCE_SCATTER = [
    ("non-tensor grad", lambda s, g: fsdpcomp.fsdp_hook(s, g.tolist(), torch.empty(N)), TypeError, "grad"),
    ("non-tensor output", lambda s, g: fsdpcomp.fsdp_hook(s, g, g.tolist()), TypeError, "output"),
    ("non-contiguous grad", lambda s, g: fsdpcomp.fsdp_hook(s, torch.stack([g, g], 1)[:, 0], torch.empty(N)),
     ValueError, "grad must be contiguous"),
    ("non-contiguous output", lambda s, g: fsdpcomp.fsdp_hook(s, g, torch.empty(2 * N)[::2]), ValueError,
     "output must be contiguous"),
    ("output too small", lambda s, g: fsdpcomp.fsdp_hook(s, g, torch.empty(N - 1)), ValueError,
     f"output has {N - 1} elements"),
    ("float64 grad", lambda s, g: fsdpcomp.fsdp_hook(s, g.double(), torch.empty(N)), TypeError, "grad must be float32"),
    ("int output", lambda s, g: fsdpcomp.fsdp_hook(s, g, torch.empty(N, dtype=torch.int32)), TypeError,
     "output must be float32"),
    ("wrong size", lambda s, g: fsdpcomp.fsdp_hook(s, torch.cat([g, g]), torch.empty(2 * N)), ValueError,
     f"{2 * N} elements.*{N}"),
    ("all-reduce non-tensor", lambda s, g: fsdpcomp.fsdp_hook(s, g.tolist()), TypeError, "grad"),
    ("all-reduce non-contiguous", lambda s, g: fsdpcomp.fsdp_hook(s, torch.stack([g, g], 1)[:, 0]), ValueError,
     "grad must be contiguous"),
    ("all-reduce wrong size", lambda s, g: fsdpcomp.fsdp_hook(s, g[:100].clone()), ValueError, f"100 elements.*{N}"),
    ("all-reduce float64", lambda s, g: s.all_reduce(g.double()), TypeError, "grad must be float32"),
]


@pytest.mark.parametrize("what,call,exc,names", REDUCE_SCATTER, ids=[c[0] for c in REDUCE_SCATTER])
def test_refused_hook_call_claims_nothing(gen, what, call, exc, names):
    """A state that saw a refused call between two steps ends up as one that never saw it."""
    first, second = _good(gen), _good(gen)
    refused, clean = _state(), _state()
    for s in (refused, clean):
        fsdpcomp.fsdp_hook(s, first.clone(), torch.empty(N))
        s.end_step()
    with pytest.raises(exc, match=names):
        call(refused, second.clone())
    _same(refused, clean)  # the refused call claimed no unit, moved no step
    for s in (refused, clean):  # the retry is the same unit 0 of step 1
        fsdpcomp.fsdp_hook(s, second.clone(), torch.empty(N))
    _same(refused, clean)
    assert refused.counters()["units"] == 1


def test_refused_reduce_scatter_with_a_key(gen):
    """FSDP2's entry point (one rank, no process group): a refused call, then the retry."""
    refused, clean = _state(), _state()
    rs, rs_clean = fsdpcomp.ReduceScatter(refused, key="a"), fsdpcomp.ReduceScatter(clean, key="a")
    g = _good(gen)
    for r in (rs, rs_clean):
        r(torch.empty(N), g.clone())
    bad = [
        (lambda: rs(torch.empty(N), g.tolist()), TypeError, "input_tensor"),
        (lambda: rs(torch.empty(N), torch.stack([g, g], 1)[:, 0]), ValueError, "input_tensor"),
        (lambda: rs(torch.empty(2 * N), torch.cat([g, g])), ValueError, f"{2 * N} elements.*{N}"),
        (lambda: rs(torch.empty(N), g, op=dist.ReduceOp.MAX), ValueError, "op"),
    ]
    for call, exc, names in bad:
        with pytest.raises(exc, match=names):
            call()
        _same(refused, clean)
    for r in (rs, rs_clean):  # the same key again: a new step, the same unit
        r(torch.empty(N), g.clone())
    _same(refused, clean)
    assert refused.step == 1 and refused.counters()["units"] == 1


def test_refused_load_state_dict_changes_nothing(gen):
    source, target = _state(), _state()
    fsdpcomp.fsdp_hook(source, _good(gen), torch.empty(N))
    source.end_step()
    fsdpcomp.fsdp_hook(target, _good(gen), torch.empty(N))
    before = target.state_dict()
    good = source.state_dict()
    for key, value, names in [("residuals", {"gather0": [torch.zeros(3)]}, "keyed by slot"),
                              ("residuals", {"gather": [[1.0, 2.0]]}, r"residuals\['gather'\]\[0\]"),
                              ("residuals", {"gather": [torch.zeros(3, dtype=torch.float64)]}, r"residuals\['gather'\]\[0\]"),
                              ("unit_keys", ["a", "b"], "unit_keys")]:
        with pytest.raises((ValueError, TypeError), match=names):
            target.load_state_dict(with_own(good, **{key: value}))
        now = target.state_dict()
        assert (now["step"], own(now).units) == (before["step"], own(before).units)
        assert all(torch.equal(a, b) for a, b in zip(own(now).residuals["scatter"], own(before).residuals["scatter"]))


def _distributed(rank, world):
    """AllReduceHook, ddp_hook and the two-rank fsdp_hook: refused calls, then good ones."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dist.group.WORLD
    errors = {}

    def refuse(name, call):
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as e:
            errors[name] = (type(e).__name__, str(e))

    g = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    states = {}
    for name in ("refused", "clean"):
        s = fsdpcomp.CommState("int8", {"error_feedback": True}, process_group=group)
        hook = fsdpcomp.AllReduceHook(s, key="mod")
        hook(g.clone())
        if name == "refused":
            refuse("allreduce non-tensor", lambda: hook(g.tolist()))
            refuse("allreduce non-contiguous", lambda: hook(torch.stack([g, g], 1)[:, 0]))
            refuse("allreduce wrong size", lambda: hook(g[:100].clone()))
            refuse("fsdp_hook output too small", lambda: fsdpcomp.fsdp_hook(s, g.clone(), torch.empty(N // 2 - 1)))
            refuse("ddp_hook non-bucket", lambda: fsdpcomp.ddp_hook(s, g))
        hook(g.clone())
        states[name] = s
    ddp = DDP(torch.nn.Linear(4, 4).double())
    ddp_state = fsdpcomp.register(ddp, "int8")
    try:
        ddp(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
        errors["ddp float64"] = None
    except Exception as e:  # DDP re-raises the hook's error from backward
        errors["ddp float64"] = (type(e).__name__, str(e))
    summary = lambda s: (s.step, own(s.state_dict()).units, s.counters()["calls"],  # noqa: E731
                         [r.clone() for r in own(s.state_dict()).residuals["scatter"]])
    return errors, summary(states["refused"]), summary(states["clean"]), ddp_state.counters()["calls"]


def test_refusals_on_two_ranks():
    for errors, refused, clean, ddp_calls in run_ranks(_distributed, 2):
        for name, err in errors.items():
            assert err is not None, f"{name} was accepted"
        assert "reduce_output" in errors["allreduce non-tensor"][1]
        assert errors["allreduce wrong size"][0] == "ValueError" and "100" in errors["allreduce wrong size"][1]
        assert "output has" in errors["fsdp_hook output too small"][1]
        assert errors["ddp_hook non-bucket"][0] == "TypeError" and "bucket" in errors["ddp_hook non-bucket"][1]
        assert "float64" in errors["ddp float64"][1] and ddp_calls == 0
        assert refused[:3] == clean[:3] and all(torch.equal(a, b) for a, b in zip(refused[3], clean[3]))
