"""Per-weight codec choice under a byte budget (issue 39): L-GreCo's knapsack over measured errors.

Alimohammadi, Markov, Frantar, Alistarh, "L-GreCo: Layerwise-Adaptive Gradient Compression"
(arXiv 2210.17357): measure, for every weight and every candidate codec, the bytes it sends and
the squared error it leaves on the weight's gradient; then pick one candidate per weight that
minimises the summed squared error with the summed bytes under a budget, by dynamic programming
over the bytes (a multiple-choice knapsack). This module is the two halves of that: `measure`
runs each candidate on a gradient through the library's own codecs (an encode and a decode of
the one chunk, exactly what a receiver sums), and `choose` solves the knapsack.

Neither is on the gradient path of a step: the study (benchmarks/budget_study.py) calls them on
sampled steps, and so will the budget method that remakes its choice every N steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from . import _C
from ._alloc import allocate
from ._config import gather_default


@dataclass(frozen=True)
class Candidate:
    """One rung of the ladder: a method and its config, and the name tables show."""
    name: str
    method: str
    config: dict = field(default_factory=dict)


def _dct(k: int) -> Candidate:
    return Candidate(f"dct {k}/128", "dct", {"block": 128, "k": k, "quantize": "intN", "value_bits": 3})


# The C core's `adaptive` ladder (csrc/methods/m_adaptive.c, _C.adaptive_ladder()) is this list, rung
# for rung: a parts table names rungs by their index here (tests/core/test_adaptive.py holds them equal).
# From exact to ~90x. Error feedback is off throughout: under AdamW every method measured did
# better without it (docs/methods.md, "32x with AdamW"), and the choice compares one call's error.
LADDER: tuple[Candidate, ...] = (
    Candidate("fp32", "none"),
    Candidate("bf16", "bf16"),
    Candidate("int8", "int8"),
    Candidate("intN 4-bit", "intN", {"bits": 4}),
    Candidate("intN 3-bit", "intN", {"bits": 3}),
    Candidate("intN 2-bit", "intN", {"bits": 2}),
    _dct(32), _dct(24), _dct(15), _dct(12), _dct(8), _dct(4),
)


@dataclass(frozen=True)
class Cost:
    """What one candidate costs on one gradient: bytes on the wire (headers included) and the
    squared error ||D(C(g)) - g||^2 it leaves."""
    bytes: int
    err_sq: float


def roundtrip(grad: torch.Tensor, candidate: Candidate) -> tuple[torch.Tensor, int]:
    """(D(C(g)), bytes on the wire): one rank's encode and decode of the flat fp32 `grad` as its
    own chunk (world 1, compress_own_chunk), through the C core directly, so it runs the same
    inside a distributed job (no process group is touched). A fresh state each time (~50 us):
    nothing carries over between calls (no residual, no unit)."""
    cfg = dict(candidate.config, compress_own_chunk=True)
    if candidate.method != "none":
        cfg["error_feedback"] = False
    core = _C.State(candidate.method, gather_default(cfg), allocate)  # the codec's own core
    unit = core.begin(grad.numel())
    splits, _ = core.plan(grad, 1, 0)
    send = torch.empty(sum(splits), dtype=torch.uint8)
    (size,) = core.encode(grad, send, 1, 0, unit)
    out = torch.empty_like(grad)
    core.decode(send[:size], grad, out, 1, 0, unit)
    return out, int(size)


def measure(grad: torch.Tensor, ladder: Sequence[Candidate] = LADDER) -> list[Cost]:
    """Every candidate's cost on the gradient `grad` (any shape; read flat in fp32): the bytes
    and ||D(C(g)) - g||^2 of its roundtrip, the codec's error alone."""
    g = grad.detach().reshape(-1).float().contiguous()
    costs = []
    for c in ladder:
        out, size = roundtrip(g, c)
        costs.append(Cost(size, float(torch.sum((out - g).double() ** 2))))
    return costs


def choose(costs: Sequence[Sequence[Cost]], budget_bytes: int, bins: int = 4096) -> list[int]:
    """One candidate index per weight minimising the summed err_sq with the summed bytes at most
    `budget_bytes`; ValueError where even the cheapest choice of every weight exceeds it.

    The bytes are counted in units of budget_bytes / bins, each weight's rounded up, so a choice
    this returns never exceeds the budget in real bytes (it may leave up to one unit per weight
    unused). Ties go to the fewer bytes. O(weights x candidates x bins)."""
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    cheapest = sum(min(c.bytes for c in row) for row in costs)
    if cheapest > budget_bytes:
        raise ValueError(f"the budget of {budget_bytes} bytes is below the cheapest choice "
                         f"({cheapest} bytes): add cheaper candidates or raise the budget")
    inf = float("inf")
    # best[b]: the least error of the weights so far within b units; pick[l][b] its choice at l
    # each option's bins, rounded up (in whole numbers): what the budget sees, here and below
    widths = [[-(-c.bytes * bins // budget_bytes) for c in row] for row in costs]
    best = torch.zeros(bins + 1, dtype=torch.float64)
    picks = []
    for row, width in zip(costs, widths):
        nxt = torch.full((bins + 1,), inf, dtype=torch.float64)
        arg = torch.full((bins + 1,), -1, dtype=torch.long)
        order = sorted(range(len(row)), key=lambda i: row[i].bytes)  # ties: the fewer bytes first
        for i in order:
            w = width[i]
            if w > bins:
                continue
            cand = torch.full((bins + 1,), inf, dtype=torch.float64)
            cand[w:] = best[: bins + 1 - w] + row[i].err_sq
            better = cand < nxt
            nxt = torch.where(better, cand, nxt)
            arg = torch.where(better, torch.full_like(arg, i), arg)
        best = nxt
        picks.append(arg)
    b = int(torch.argmin(best))
    if best[b] == inf:
        raise ValueError(f"no choice fits {budget_bytes} bytes at {bins} bins: raise bins")
    choice = [0] * len(costs)
    for layer in range(len(costs) - 1, -1, -1):
        i = int(picks[layer][b])
        choice[layer] = i
        b -= widths[layer][i]
    return choice
