"""Residuals stay with their unit when a unit gets no gradient in a step: FSDP1 (and FSDP2) skip
the reduction of a block that did not take part, so keying units by call order would hand every
later block of the same size its neighbour's residual. Real FSDP1/FSDP2 on 2 gloo ranks; the
reference keeps one CommState per unit, which no keying can get wrong."""
import pytest
import torch

import fsdpcomp
from helpers.ckpt import own
from helpers.dist_utils import run_ranks
from helpers.step_models import Blocks, fsdp1, fsdp2, full_params, per_unit_states, train

METHOD, CONFIG = "topk", {"ratio": 0.25}  # error feedback on by default; no RNG
STEPS = 6
BRANCH = lambda step: {"use_branch": step % 3 != 1}  # noqa: E731  off on steps 1 and 4


def _run(rank, world, kind):
    wrap = fsdp1 if kind == "fsdp1" else fsdp2
    # no parameters outside the blocks: the skipped branch is the only difference between steps
    model = Blocks(io=False)
    wrapped = wrap(model)
    state = fsdpcomp.register(wrapped, METHOD, CONFIG)
    train(rank, model, wrapped, STEPS, BRANCH)
    mine = (full_params(wrapped), dict(state.counters()), state.state_dict())

    bare = None
    if kind == "fsdp1":  # the long form: torch's register_comm_hook with one bare CommState
        model = Blocks(io=False)
        wrapped = wrap(model)
        state = fsdpcomp.CommState(METHOD, CONFIG, process_group=wrapped.process_group)
        wrapped.register_comm_hook(state, fsdpcomp.fsdp_hook)
        train(rank, model, wrapped, STEPS, BRANCH)
        bare = (full_params(wrapped), dict(state.counters()))

    model = Blocks(io=False)
    wrapped = wrap(model)
    states = per_unit_states(wrapped, kind, METHOD, CONFIG)
    train(rank, model, wrapped, STEPS, BRANCH)
    return mine, bare, full_params(wrapped), [own(s.state_dict()).residuals["scatter"] for s in states]


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_skipped_unit_keeps_residuals_apart(kind):
    for rank, ((params, c, sd), bare, ref, ref_residuals) in enumerate(run_ranks(_run, 2, kind)):
        assert c["units"] == 4 and c["step"] == STEPS
        assert c["calls"] == STEPS * 4 - 2  # the branch sat out two steps
        assert torch.equal(params, ref), f"{kind} rank {rank}: residuals were mixed between units"
        # each unit's residual is the one its own state holds in the reference
        mine = sorted(bytes(r.numpy()) for r in sd[f"rank{rank}"].residuals["scatter"])
        theirs = sorted(bytes(r[0].numpy()) for r in ref_residuals if r)
        assert mine == theirs
        assert sorted(sd[f"rank{rank}"].unit_keys) == ["blocks.0", "blocks.1", "blocks.2", "branch"]
        if bare is not None:  # a bare CommState keys FSDP1 units by their flat parameter
            assert torch.equal(bare[0], ref) and bare[1]["units"] == 4, f"rank {rank}: bare state"
