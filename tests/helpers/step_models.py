"""The model and training loop of the step and unit tests: same-sized blocks (units that a wrong
key would silently mix), reentrant activation checkpointing on demand, a block that takes part
only on some steps, and a tripwire that makes a backward raise after some hooks ran."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import fsdpcomp

DIM = 8


class Tripwire(torch.autograd.Function):
    """Identity forward; its backward raises, after the blocks behind it have reduced."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("tripwire: this backward fails on purpose")


class Blocks(nn.Module):
    """inp -> blocks[0] -> (tripwire) -> blocks[1:] -> (branch, on some steps) -> out.

    Every block and the branch have DIM * (DIM + 1) parameters. Without `io` the model has no
    parameters outside them, so under FSDP1 the root unit reduces nothing: a skipped branch then
    shifts every later unit onto a neighbour's residual of the same size, without any error."""

    def __init__(self, n_blocks=3, io=True):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(6, DIM) if io else nn.Identity()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(n_blocks))
        self.branch = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
        self.out = nn.Linear(DIM, 4) if io else nn.Identity()
        self.in_dim, self.out_dim = (6, 4) if io else (DIM, DIM)
        self.reentrant = False  # torch.utils.checkpoint(..., use_reentrant=True) around blocks
        self.armed = False      # the tripwire after blocks[0]
        self.use_branch = True

    def forward(self, x):
        h = self.inp(x)
        for i, block in enumerate(self.blocks):
            h = checkpoint(block, h, use_reentrant=True) if self.reentrant else block(h)
            if i == 0 and self.armed:
                h = Tripwire.apply(h)
        if self.use_branch:
            h = self.branch(h)
        return self.out(h)


def fsdp1(model):
    """FSDP1 with one unit per block and one for the branch (and the root for inp/out)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}),
                use_orig_params=True)


def fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    for block in list(model.blocks) + [model.branch]:
        fully_shard(block)
    return fully_shard(model)


def per_unit_states(wrapped, kind, method, config):
    """The reference for unit keying: one CommState per FSDP unit (FSDP1: each FSDP instance's
    hook state; FSDP2: each FSDPModule's ReduceScatter), so no unit can take another's residual."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    states = []
    if kind == "fsdp1":
        wrapped.register_comm_hook(fsdpcomp.CommState(method, config), fsdpcomp.fsdp_hook)
        for m in wrapped.modules():
            if isinstance(m, FSDP):  # torch passes each instance its own _comm_hook_state
                m._comm_hook_state = fsdpcomp.CommState(method, config, process_group=m.process_group)
                states.append(m._comm_hook_state)
    else:
        for m in wrapped.modules():
            if isinstance(m, FSDPModule):
                states.append(fsdpcomp.CommState(method, config))
                m.set_custom_reduce_scatter(fsdpcomp.ReduceScatter(states[-1]))
    return states


def train(rank, model, wrapped, steps, plan=lambda step: {}, lr=0.1, after_failure=None):
    """SGD steps on rank-specific data; plan(step) sets the model's switches for that step.
    A step whose backward trips the wire is skipped (no optimizer step); after_failure() runs
    then. Returns how many backwards failed."""
    opt = torch.optim.SGD(wrapped.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(100 + rank)
    failed = 0
    for step in range(steps):
        for name, value in {"armed": False, "use_branch": True, **plan(step)}.items():
            setattr(model, name, value)
        # an input that requires grad, as an embedding's output would: a reentrant checkpoint
        # right after the input has no gradient to give otherwise
        x = torch.randn(8, model.in_dim, generator=gen).requires_grad_()
        y = torch.randn(8, model.out_dim, generator=gen)
        try:
            nn.functional.mse_loss(wrapped(x), y).backward()
            opt.step()
        except RuntimeError as e:
            if "tripwire" not in str(e):
                raise
            failed += 1
            if after_failure is not None:
                after_failure()
        opt.zero_grad()
    return failed


def full_params(wrapped):
    """Every parameter, unsharded, as one flat tensor (the same on every rank)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(wrapped, FSDP):
        with FSDP.summon_full_params(wrapped):
            return torch.cat([p.detach().reshape(-1).clone() for p in wrapped.parameters()])
    flat = []
    for p in wrapped.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        flat.append(p.detach().reshape(-1).clone())
    dist.barrier()
    return torch.cat(flat)
