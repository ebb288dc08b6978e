"""Writes the format-2 checkpoints tests/distributed/test_format2_loads.py reads: made ONCE by the
fsdpcomp that wrote format 2 (commit 7de917d, the last before format 3), kept as files so the
test loads what an old run really saved, not what today's code imagines it saved.

    git worktree add --detach /tmp/oldfmt 7de917d && (cd /tmp/oldfmt && FSDPCOMP_CUDA=0 \
        python setup.py -q build_ext --inplace)
    PYTHONPATH=/tmp/oldfmt:tests python tests/data/format2/make.py tests/data/format2

Each case: 2 gloo ranks, all_reduce (so the all-gather half keeps residuals too) on two units for
3 steps, then the state_dict saved, then one more step from the same gradients: its outputs and
the state_dict after it, which a resumed run must reproduce bit for bit."""
import os
import sys

import torch

import fsdpcomp
from fsdpcomp._layout import Layout
from helpers.dist_utils import run_ranks

CASES = {
    "int8_fp32": ("int8", {"block_size": 64, "error_feedback": True, "allgather_compress": True}),
    "int8_int8": ("int8", {"block_size": 64, "error_feedback": True, "allgather_compress": True,
                           "residual_dtype": "int8"}),
    "topk_bf16": ("topk", {"ratio": 0.1, "error_feedback": True, "allgather_compress": True,
                           "residual_dtype": "bf16"}),
    "powersgd_fp32": ("powersgd", {"start_iter": 0, "rank": 1}),
    "powersgd_int8": ("powersgd", {"start_iter": 0, "rank": 1, "residual_dtype": "int8"}),
}
LAYOUT = Layout.of_shapes([(24, 10)])


def step(state, rank, i):
    """One step: two units' all-reduce from gradients seeded by (rank, step)."""
    outs = []
    for key, n in (("a", 240), ("b", 700)):
        g = torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + 10 * i + n))
        state.all_reduce(g, key, matrices=LAYOUT if n == 240 else None)
        outs.append(g)
    state.end_step()
    return outs


def _make(rank, world, method, config):
    state = fsdpcomp.CommState(method, config)
    for i in range(3):
        step(state, rank, i)
    saved = state.state_dict()
    outs = step(state, rank, 3)
    return {"method": method, "config": config, "saved": saved, "next_outs": outs, "after": state.state_dict()}


if __name__ == "__main__":
    out = sys.argv[1]
    for name, (method, config) in CASES.items():
        for rank, result in enumerate(run_ranks(_make, 2, method, config)):
            torch.save(result, os.path.join(out, f"{name}.rank{rank}.pt"))
        print("wrote", name)
