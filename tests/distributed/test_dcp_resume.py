"""Checkpoints the way FSDP2 users write them: dcp.save({"model", "optim", "fsdpcomp": state})
with torch.distributed.checkpoint, then dcp.load in FRESH processes (a separate spawn), trains
on bit-identically to the uninterrupted run: parameters, losses and every rank's own residuals,
under FSDP2 and DDP (its residuals packed in 8 bits) on 2 gloo ranks. A checkpoint of another world size is refused by name;
state.without_residuals() resumes it on purpose. A rank 0 file loaded on every rank is refused."""
import io

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

import fsdpcomp
from helpers.ckpt import own
from helpers.dist_utils import run_ranks
from helpers.step_models import Blocks, fsdp2

STEPS, SPLIT = 6, 3
# error feedback (a residual per rank and unit) and stochastic rounding (streams of the step)
METHOD, CONFIG = "intN", {"bits": 2, "stochastic": True, "error_feedback": True, "block_size": 16}
# DDP keeps its residuals (the C core's and the all-gather halves') packed in 8 bits: DCP carries both
CONFIGS = {"fsdp2": CONFIG, "ddp": dict(CONFIG, residual_dtype="int8")}


def _build(kind):
    model = Blocks()
    wrapped = fsdp2(model) if kind == "fsdp2" else DDP(model, bucket_cap_mb=0.0002)
    state = fsdpcomp.register(wrapped, METHOD, CONFIGS[kind])
    opt = torch.optim.Adam(wrapped.parameters(), lr=0.01)
    return model, wrapped, state, opt


def _step(rank, t, model, wrapped, opt):
    gen = torch.Generator().manual_seed(1000 * rank + t)  # step t's data, whoever runs it
    x, y = torch.randn(8, model.in_dim, generator=gen), torch.randn(8, model.out_dim, generator=gen)
    loss = torch.nn.functional.mse_loss(wrapped(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _outcome(wrapped, state, losses):
    params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in wrapped.parameters()]
    mine = own(state.state_dict())
    return params, losses, mine.unit_keys, mine.residuals, state.step


def _whole(rank, world, kind):
    model, wrapped, state, opt = _build(kind)
    return _outcome(wrapped, state, [_step(rank, t, model, wrapped, opt) for t in range(STEPS)])


def _first_half(rank, world, kind, path):
    model, wrapped, state, opt = _build(kind)
    losses = [_step(rank, t, model, wrapped, opt) for t in range(SPLIT)]
    msd, osd = get_state_dict(wrapped, opt)
    dcp.save({"model": msd, "optim": osd, "fsdpcomp": state}, checkpoint_id=path)
    # a plain torch.save of rank 0's state, loaded on every rank: refused on the others
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    blobs = [None] * world
    dist.all_gather_object(blobs, buf.getvalue())
    before = own(state.state_dict()).residuals["scatter"]
    try:
        state.load_state_dict(torch.load(io.BytesIO(blobs[0])))  # torch.load's default: weights_only
        refused = None
    except ValueError as e:
        refused = str(e)
    after = own(state.state_dict()).residuals["scatter"]
    unchanged = all(torch.equal(a, b) for a, b in zip(before, after))
    return losses, refused, unchanged


def _second_half(rank, world, kind, path):
    model, wrapped, state, opt = _build(kind)
    msd, osd = get_state_dict(wrapped, opt)
    sd = {"model": msd, "optim": osd, "fsdpcomp": state}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(wrapped, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    assert state.step == SPLIT - (kind == "ddp")  # DDP's first backward is its warm-up
    return _outcome(wrapped, state, [_step(rank, t, model, wrapped, opt) for t in range(SPLIT, STEPS)])


def _other_world(rank, world, kind, path):
    """A checkpoint of 2 ranks at 1: refused with the state kept; resumed with the residuals dropped."""
    model, wrapped, state, opt = _build(kind)
    msd, osd = get_state_dict(wrapped, opt)
    try:
        dcp.load({"model": msd, "optim": osd, "fsdpcomp": state}, checkpoint_id=path)
        refused = None
    except ValueError as e:
        refused = str(e)
    fresh = state.step == 0 and state.unit_keys == ()
    dcp.load({"model": msd, "optim": osd, "fsdpcomp": state.without_residuals()}, checkpoint_id=path)
    step = state.step
    losses = [_step(rank, t, model, wrapped, opt) for t in range(SPLIT, STEPS)]
    return refused, fresh, step, losses


KINDS = ("fsdp2", "ddp")


# every kind in one spawn (spawns are slow); each kind's checkpoint in root/<kind>
def _whole_all(rank, world, root):
    return {kind: _whole(rank, world, kind) for kind in KINDS}


def _first_all(rank, world, root):
    return {kind: _first_half(rank, world, kind, f"{root}/{kind}") for kind in KINDS}


def _second_all(rank, world, root):
    return {kind: _second_half(rank, world, kind, f"{root}/{kind}") for kind in KINDS}


def _other_world_all(rank, world, root):
    return {kind: _other_world(rank, world, kind, f"{root}/{kind}") for kind in KINDS}


def test_dcp_resume_in_fresh_processes_is_bit_identical(tmp_path):
    root = str(tmp_path)
    whole = run_ranks(_whole_all, 2, root)
    first = run_ranks(_first_all, 2, root)
    resumed = run_ranks(_second_all, 2, root)  # new processes: nothing but the files carries over
    other = run_ranks(_other_world_all, 1, root)[0]
    for kind in KINDS:
        for rank in range(2):
            params, losses, keys, residuals, step = whole[rank][kind]
            params_r, losses_r, keys_r, residuals_r, step_r = resumed[rank][kind]
            where = f"{kind} rank {rank}"
            assert first[rank][kind][0] + losses_r == losses, f"{where}: the loss curve differs after the resume"
            assert all(torch.equal(p, q) for p, q in zip(params, params_r)), f"{where}: parameters differ"
            assert keys_r == keys and step_r == step
            scatter = residuals["scatter"]
            assert len(scatter) >= 3 and all(r is not None and r.abs().sum() > 0 for r in scatter)
            if kind == "ddp":  # an all-reduce: the all-gather half keeps its own, one per bucket
                assert all(r is not None for r in residuals["gather"])
            for slot, table in residuals.items():  # every slot back, bit for bit
                assert len(table) == len(residuals_r[slot]) and all(
                    (r is None and q is None) or torch.equal(r, q) for r, q in zip(table, residuals_r[slot])), \
                    f"{where}: {slot} residuals differ"
        # each rank got its own residuals back, not the other's
        assert not all(torch.equal(a, b) for a, b in zip(whole[0][kind][3]["scatter"], whole[1][kind][3]["scatter"]))
        # rank 0's plain state_dict on rank 1: refused by name, nothing changed
        assert first[0][kind][1] is None
        assert "holds the state of rank0, this is rank 1" in first[1][kind][1] and first[1][kind][2]

        refused, fresh, step, losses = other[kind]
        assert "saved at world size 2, this run has 1 ranks" in refused and 'residuals="drop"' in refused
        assert fresh, f"{kind}: a refused load changed the state"
        assert step == SPLIT - (kind == "ddp")
        assert all(torch.isfinite(torch.tensor(losses)))
