"""A resumed DDP run is bit-identical to the uninterrupted one: model, optimizer and CommState
saved after step k, loaded into a fresh DDP wrapper (whose buckets, like any new DDP's, are not
yet the rebuilt ones), trained on to the end; 2 gloo ranks, a deterministic and a stochastic
method."""
import io

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import fsdpcomp
from helpers.dist_utils import run_ranks
from helpers.step_models import Blocks

STEPS = 6
BUCKET_MB = 0.0002  # several buckets


def _step(rank, t, model, ddp, opt):
    gen = torch.Generator().manual_seed(1000 * rank + t)  # step t's data, whoever runs it
    x, y = torch.randn(8, model.in_dim, generator=gen), torch.randn(8, model.out_dim, generator=gen)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    opt.zero_grad()


def _fresh(method, config, checkpoint=None):
    model = Blocks()
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    state = fsdpcomp.CommState(method, config)
    if checkpoint is not None:
        state.load_state_dict(checkpoint["comm"])
    fsdpcomp.register(ddp, state)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    if checkpoint is not None:
        opt.load_state_dict(checkpoint["opt"])
    return model, ddp, state, opt


def _run(rank, world, method, config, split):
    model, ddp, state, opt = _fresh(method, config)
    for t in range(STEPS):
        if t == split:  # a checkpoint through bytes, then everything anew as in a new process
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "comm": state.state_dict()}, buf)
            buf.seek(0)
            del model, ddp, state, opt
            model, ddp, state, opt = _fresh(method, config, torch.load(buf, weights_only=False))
        _step(rank, t, model, ddp, opt)
    c = state.counters()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), c["step"], c["calls"], c["units"]


@pytest.mark.parametrize("method,config", [("int8", {"error_feedback": True, "block_size": 16}),
                                           ("intN", {"bits": 2, "stochastic": True, "error_feedback": True})])
@pytest.mark.parametrize("split", [2, 4])
def test_resumed_ddp_run_is_bit_identical(method, config, split):
    whole = run_ranks(_run, 2, method, config, None)
    resumed = run_ranks(_run, 2, method, config, split)
    for rank, ((p, step, calls, units), (q, step_r, calls_r, units_r)) in enumerate(zip(whole, resumed)):
        assert torch.equal(p, q), f"rank {rank}: resumed at step {split}, max diff {(p - q).abs().max()}"
        assert step == step_r == STEPS - 1  # the first backward is DDP's warm-up, once
        assert units_r == units >= 3
        assert calls_r < calls  # the resumed state's counters start after the checkpoint
