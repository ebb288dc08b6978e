"""The all-gather half of an all-reduce keeps the range and NaN rules of the reduce-scatter
(saturation, no NaN/Inf kept in a residual): its g' = shard + e and its residual e = g' - D come
from compress(x, payload, residual=e) (the C driver, csrc/common/fc_range.h), which must give the
reduce-scatter's residuals, and on real ranks a shard near fp32's largest value or holding a NaN
never leaves a NaN/Inf in a residual or an output that the input did not have."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.ckpt import own
from helpers.dist_utils import run_ranks

FMAX = torch.finfo(torch.float32).max
# deterministic codecs: the payload does not depend on the step or the stream
DETERMINISTIC = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("fp8", {}),
                 ("intN", {"bits": 4}), ("intN", {"bits": 3, "scheme": "minmax"}), ("onebit", {})]


def huge(gen, n=4096, nan=False):
    """Values near fp32's largest of both signs (every third), ordinary ones between, and with
    `nan` a few NaN/Inf."""
    x = torch.randn(n, generator=gen)
    big = FMAX * (0.6 + 0.4 * torch.rand(n, generator=gen)) * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    x = torch.where(torch.arange(n) % 3 == 0, big, x)
    if nan:
        x[[5, 700, 3001]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return x


def gather_half(st, g, e):
    """What fsdpcomp/_shard_gather.py does with one shard: one payload of g + e by compress(), which
    replaces e (None: a fresh zero residual); the payload and the residual."""
    e = torch.zeros_like(g) if e is None else e
    p = torch.zeros(st.payload_bytes(g.numel()), dtype=torch.uint8)
    w = st.compress(g.clone(), p, residual=e)
    return p[:w], e


@pytest.mark.parametrize("method,cfg", DETERMINISTIC, ids=lambda v: str(v))
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_compress_with_a_residual_gives_the_reduce_scatters_residuals(method, cfg, mode, gen):
    """Three steps of one rank compressing its own chunk with error feedback (the reduce-scatter)
    against the same steps through compress(residual=e): the same residuals, finite, and the
    saturated sums counted."""
    c = fsdpcomp.CommState(method, dict(cfg, error_feedback=True, compress_own_chunk=True, nonfinite=mode))
    st = _C.State(method, dict(cfg, nonfinite=mode))
    e = None
    for step, nan in enumerate((False, True, False)):
        g = huge(gen, nan=nan)
        c.reduce_scatter(g, torch.empty(g.numel()))
        c.end_step()
        payload, e = gather_half(st, g, e)
        r = c._core.residuals()[0]
        assert torch.isfinite(e).all() and torch.isfinite(r).all()
        assert torch.equal(e, r), (step, (e != r).nonzero()[:5].flatten().tolist())
    assert (st.counters()["saturated"] > 0) == (method != "none")  # none: e = 0, x + 0 is finite


def _all_reduce(rank, world, method, mode):
    """fsdp_hook's NO_SHARD meaning (an all-reduce: compressed reduce-scatter, compressed
    all-gather) with error feedback over steps near fp32's largest value, one with NaN/Inf."""
    gen = torch.Generator().manual_seed(10 + rank)
    state = fsdpcomp.CommState(method, {"error_feedback": True, "nonfinite": mode})
    state.process_group = torch.distributed.group.WORLD
    outs = []
    for step in range(4):
        g = huge(gen, n=4000 * world, nan=step == 1 and rank == 0)
        fsdpcomp.fsdp_hook(state, g)
        outs.append(g.clone())
        state.end_step()
    gathered = [r.clone() for r in own(state.state_dict()).residuals["gather"] if r is not None]
    return outs, gathered, dict(state.counters())


@pytest.mark.parametrize("method", ["int8", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_an_all_reduce_near_fp32_max_stays_finite(method, mode):
    """On main the all-gather half added shard + e in torch (Inf for two finite values) and kept
    e = x - D of a shard with NaN: that residual was NaN from then on, every later output too."""
    results = run_ranks(_all_reduce, 2, method, mode)
    for rank, (outs, gathered, c) in enumerate(results):
        assert gathered and all(torch.isfinite(r).all() for r in gathered), rank
        for step, o in enumerate(outs):
            if step == 1 and mode == "pass":
                assert not torch.isfinite(o).all()  # rank 0's NaN/Inf went through, counted
                continue
            assert torch.isfinite(o).all(), (rank, step)
            assert torch.equal(o, results[0][0][step]), (rank, step)  # replicas identical
        assert c["saturated"] > 0
