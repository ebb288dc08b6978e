"""gradiveq's learned basis travels in CommState.state_dict(): a run resumed from a checkpoint
taken after the basis was learned sends the same bytes and decodes the same values as the
uninterrupted run, on real gloo ranks (the basis is learned through their all-reduce)."""
import pytest
import torch

import fsdpcomp
from helpers.ckpt import own, with_own
from helpers.dist_utils import run_ranks

CFG = {"dim": 16, "k": 4, "warmup": 2, "refresh": 0, "min_numel": 64, "error_feedback": True}
SIZES = (240, 48)  # the second unit is below min_numel: plain `none`, no unit state


def _grads(rank, steps, seed):
    """Per rank and step, one gradient per unit, low rank plus noise so PCA has a subspace."""
    g = torch.Generator().manual_seed(seed + rank)
    basis = torch.randn(16, 3, generator=torch.Generator().manual_seed(seed))
    out = []
    for _ in range(steps):
        units = []
        for n in SIZES:
            slices = basis @ torch.randn(3, -(-n // 16), generator=g)
            units.append((slices.T.reshape(-1)[:n] + 0.05 * torch.randn(n, generator=g)).contiguous())
        out.append(units)
    return out


def _step(state, grads, world, probe):
    """One backward's worth of hook calls; returns the shards and the payload of a probe chunk."""
    shards = []
    for grad in grads:
        out = torch.empty(-(-grad.numel() // world))
        fsdpcomp.fsdp_hook(state, grad.clone(), out)
        shards.append(out)
    state.end_step()
    payload = torch.zeros(state._core.payload_bytes(probe.numel()), dtype=torch.uint8)
    written = state._core.compress(probe, payload, unit=0)
    return shards, payload[:written]


def _resume(rank, world, seed, steps, cut):
    """Whether the resumed run matches the uninterrupted one, with the checkpoint's unit states
    and (the control) without them, which restarts the basis from the seed."""
    grads = _grads(rank, steps, seed)
    probe = torch.randn(120, generator=torch.Generator().manual_seed(seed + 99))
    whole = fsdpcomp.CommState("gradiveq", CFG)
    ref = [_step(whole, grads[s], world, probe) for s in range(steps)]

    first = fsdpcomp.CommState("gradiveq", CFG)
    for s in range(cut):
        _step(first, grads[s], world, probe)
    sd = first.state_dict()
    same = []
    for checkpoint in (sd, with_own(sd, unit_states=None)):
        resumed = fsdpcomp.CommState("gradiveq", CFG)
        resumed.load_state_dict(checkpoint)
        got = [_step(resumed, grads[s], world, probe) for s in range(cut, steps)]
        same.append(all(torch.equal(a, b) for (sa, pa), (sb, pb) in zip(ref[cut:], got)
                        for a, b in zip(sa + [pa], sb + [pb])))
    return same, [t is None for t in own(sd).unit_states]


@pytest.mark.parametrize("world", [2, 3])
def test_resumed_run_matches_the_uninterrupted_one(world):
    for (with_basis, without_basis), none_units in run_ranks(_resume, world, 1234, 5, 3):
        assert with_basis
        assert not without_basis  # the control: the test sees the basis
        assert none_units == [False, True]  # gradiveq's unit has a basis, `none`'s has none


@pytest.fixture
def learned(gen):
    """A one-rank gradiveq state that has learned its basis (compress_own_chunk loops back)."""
    s = fsdpcomp.CommState("gradiveq", {"dim": 16, "k": 4, "warmup": 1, "compress_own_chunk": True,
                                        "error_feedback": True})
    fsdpcomp.fsdp_hook(s, torch.randn(256, generator=gen), torch.empty(256))
    s.end_step()
    return s


def _payload(state, x):
    buf = torch.zeros(state._core.payload_bytes(x.numel()), dtype=torch.uint8)
    return buf[:state._core.compress(x, buf, unit=0)].clone()


def test_state_dict_holds_the_learned_basis(learned, gen):
    fresh = fsdpcomp.CommState("gradiveq", learned.config)
    fresh.load_state_dict(with_own(learned.state_dict(), unit_states=None))
    x = torch.randn(128, generator=gen)
    assert not torch.equal(_payload(fresh, x), _payload(learned, x))  # seed basis != learned one
    fresh.load_state_dict(learned.state_dict())
    assert torch.equal(_payload(fresh, x), _payload(learned, x))
    u = own(learned.state_dict()).unit_states[0][:64].view(4, 16).double()
    assert torch.allclose(u @ u.T, torch.eye(4, dtype=torch.float64), atol=1e-5)


def _corrupt(sd, how):
    state = own(sd).unit_states[0].clone()
    if how == "nan":
        state[5] = float("nan")
    elif how == "scaled":
        state[:16] *= 1.5  # the first basis vector no longer has unit length
    elif how == "short":
        state = state[:-1]
    elif how == "dtype":
        state = state.double()
    return with_own(sd, unit_states=[state])


@pytest.mark.parametrize("how,exc,pattern", [
    ("nan", ValueError, r"unit state 0: gradiveq unit state: value 5 is nan \(basis\)"),
    ("scaled", ValueError, r"basis vectors 0 and 0 have dot product 2.25.*not an orthonormal"),
    ("short", ValueError, r"'gradiveq' keeps 320 floats of state per unit, got 319"),
    ("dtype", TypeError, r"unit state must be float32"),
])
def test_corrupted_basis_is_refused_and_nothing_changes(learned, gen, how, exc, pattern):
    sd = learned.state_dict()
    x = torch.randn(128, generator=gen)
    before = _payload(learned, x)
    learned.end_step()  # move the step on: a refused load must not reset it
    step = learned.step
    with pytest.raises(exc, match=pattern):
        learned.load_state_dict(_corrupt(sd, how))
    assert learned.step == step
    assert torch.equal(own(learned.state_dict()).unit_states[0], own(sd).unit_states[0])
    assert torch.equal(own(learned.state_dict()).residuals["scatter"][0], own(sd).residuals["scatter"][0])
    learned._core.restore(own(sd).units, own(sd).residuals["scatter"], sd["step"], own(sd).unit_states)
    assert torch.equal(_payload(learned, x), before)


def test_state_dict_of_another_method_or_config_is_refused(learned):
    snap = learned.state_dict()
    other = fsdpcomp.CommState("gradiveq", {"dim": 8, "k": 4, "warmup": 1, "compress_own_chunk": True,
                                           "error_feedback": True})
    with pytest.raises(ValueError, match="config differs"):
        other.load_state_dict(snap)
    with pytest.raises(ValueError, match="for method 'gradiveq', this state is 'int8'"):
        fsdpcomp.CommState("int8", {"compress_own_chunk": True}).load_state_dict(snap)
    # below the C layer, a basis for another config is refused by its length
    with pytest.raises(ValueError, match="keeps 96 floats of state per unit, got 320"):
        other._core.restore(own(snap).units, [None], 0, own(snap).unit_states)
    # a unit state given for a unit whose method keeps none
    small = fsdpcomp.CommState("gradiveq", {"min_numel": 1000})
    fsdpcomp.fsdp_hook(small, torch.ones(256), torch.empty(256))
    with pytest.raises(ValueError, match="uses 'none', which keeps no unit state"):
        small._core.restore([256], [None], 0, own(snap).unit_states)
    assert own(other.state_dict()).units == [] and learned.state_dict()["step"] == snap["step"]
