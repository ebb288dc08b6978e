"""The `adaptive` method's chooser: each weight's codec picked under a byte budget from errors
measured on the run's own gradients (issue 39; L-GreCo, Alimohammadi et al., arXiv 2210.17357).

The C method `adaptive` (csrc/methods/m_adaptive.c) sends one payload per chunk made of per-weight
parts, each part the body of one rung of its ladder (_budget.py's LADDER: exact, bf16, int8,
intN 4/3/2 bits, dct 32..4 of 128) over that weight's span of the chunk; which rung each span uses
is the unit's parts table (`core.set_parts`). This reducer keeps those tables right:

- every `every` steps (step 0 first, when every table is still exact) it measures, on each unit's
  gradient, every rung on every part of the chunks this rank sends (_budget.py's measure: the
  codecs' own bytes and squared error);
- at the first call of the next step it sums those costs over the ranks (one all-reduce), solves
  one knapsack over every part of every unit for the bytes `none` would send / `ratio`
  (_budget.py's choose), and sets every unit's table. Every rank sums the same numbers and
  solves the same problem, so every rank sets the same tables; a payload whose sender's table
  differs is refused (the table's hash is in the header).

`objective` "l-greco" minimises the summed squared error, as the paper; "per-param" each part's
error relative to its gradient's squared norm, times its elements (AdamW normalises every
coordinate, so a small weight's relative error matters as much as a large one's).
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import torch
import torch.distributed as dist

from . import _budget
from ._codec_reducer import CodecReducer
from ._dist import Ranks
from ._layout import Layout

NAME = "adaptive"
STATE_VERSION = 1
HEADER = 32  # a roundtrip's payload header: a part of a chunk pays none (its padding is small)


def parts_of(layout: Layout | None, numel: int) -> list[int]:
    """The ends of a unit's parts: each parameter's matrix in each block its own part, and each
    stretch between them (vectors, padding) one more; the whole unit one part without a layout."""
    if layout is None or not layout.pieces:
        return [numel]
    block = numel // layout.blocks
    cuts = set()
    for b in range(layout.blocks):
        base = b * block
        for off, rows, cols in layout.pieces:
            cuts.update((base + off, base + off + rows * cols))
        cuts.add(base + block)
    cuts.add(numel)
    return sorted(c for c in cuts if 0 < c <= numel)


class AdaptiveReducer(CodecReducer):
    """The C method `adaptive` and the choice of its parts tables (see the module docstring)."""

    takes_layout = True  # where each weight lies: its parts
    method_state_key = NAME

    def __init__(self, method: str, config: Mapping[str, Any]):
        super().__init__(method, config)
        c = self.core.config
        self.ratio, self.every, self.objective = float(c["ratio"]), int(c["every"]), c["objective"]
        self.ladder = _budget.LADDER  # = _C.adaptive_ladder(), which the parts tables index
        self.ends: dict[int, list[int]] = {}  # unit -> its parts' ends (the layout's)
        self.rungs: dict[int, list[int]] = {}  # unit -> each part's rung, as set in the core
        self.costs: dict[int, list[list[_budget.Cost]]] = {}  # unit -> per part, per rung
        self.norms: dict[int, list[float]] = {}  # unit -> per part: ||g||^2 over the sent chunks
        self.measured_at = -1
        self.chosen_at = -1
        self.measure_s = 0.0  # seconds spent measuring and choosing (counters)
        self.history: list[tuple[int, list[int]]] = []  # (step measured, every part's rung) per choice

    def reduce_scatter(self, grad, output, unit: int, ranks: Ranks, step: int, layout: Layout | None) -> None:
        if step > self.measured_at >= 0 and self.chosen_at < self.measured_at:
            self._choose(ranks)
        ends = self.ends.get(unit)
        if ends is None:  # once per unit: a unit's layout does not change
            ends = self.ends[unit] = parts_of(layout, grad.numel())
        if step % self.every == 0:
            t0 = time.perf_counter()
            self._measure(grad, unit, ranks, ends)
            self.measure_s += time.perf_counter() - t0
            self.measured_at = step
        super().reduce_scatter(grad, output, unit, ranks, step, layout)

    # ---- measuring and choosing

    def _sent_spans(self, numel: int, ranks: Ranks) -> list[tuple[int, int]]:
        """The chunks this rank sends: every chunk but its own (all of them with compress_own_chunk)."""
        per = -(-numel // ranks.world)
        own = None if self.core.config["compress_own_chunk"] else ranks.rank
        return [(q * per, min((q + 1) * per, numel)) for q in range(ranks.world)
                if q != own and q * per < numel]

    def _measure(self, grad: torch.Tensor, unit: int, ranks: Ranks, ends: list[int]) -> None:
        g = grad.detach().reshape(-1).float().cpu()
        rows, norms = [], []
        start = 0
        for end in ends:
            cost = [(0, 0.0)] * len(self.ladder)
            norm = 0.0
            for a, b in self._sent_spans(g.numel(), ranks):
                lo, hi = max(a, start), min(b, end)
                if lo >= hi:
                    continue
                piece = g[lo:hi].contiguous()
                norm += float(piece.double().square().sum())
                cost = [(n + max(c.bytes - HEADER, 0), e + c.err_sq)
                        for (n, e), c in zip(cost, _budget.measure(piece, self.ladder))]
            rows.append([_budget.Cost(n, e) for n, e in cost])
            norms.append(norm)
            start = end
        self.costs[unit], self.norms[unit] = rows, norms

    def _choose(self, ranks: Ranks) -> None:
        """Every unit's table from the costs summed over ranks: one knapsack for the whole model."""
        t0 = time.perf_counter()
        units = sorted(self.costs)
        rows = [r for u in units for r in self.costs[u]]
        sizes = torch.tensor([[c.bytes for c in r] for r in rows], dtype=torch.float64)
        errs = torch.tensor([[c.err_sq for c in r] for r in rows], dtype=torch.float64)
        norms = torch.tensor([n for u in units for n in self.norms[u]], dtype=torch.float64)
        if ranks.world > 1:
            for t in (sizes, errs, norms):  # every rank the same numbers, so the same choice
                dist.all_reduce(t, group=ranks.group)
        elems = torch.tensor([e - s for u in units for s, e in zip([0] + self.ends[u][:-1], self.ends[u])],
                             dtype=torch.float64)
        if self.objective == "per-param":
            errs = errs * (elems / norms.clamp_min(1e-300)).unsqueeze(1)
        costs = [[_budget.Cost(int(sizes[i, j]), float(errs[i, j])) for j in range(len(self.ladder))]
                 for i in range(len(rows))]
        budget = int(sum(r[0].bytes for r in costs) / self.ratio)  # rung 0: fp32, what `none` sends
        try:
            pick = _budget.choose(costs, budget)
        except ValueError:  # the ratio asks for less than the cheapest rungs: take those
            pick = [min(range(len(r)), key=lambda j: r[j].bytes) for r in costs]
        at = 0
        for u in units:
            n = len(self.ends[u])
            self._set(u, pick[at:at + n])
            self.costs[u] = costs[at:at + n]  # the summed ones: what counters show
            at += n
        self.chosen_at = self.measured_at
        self.history.append((self.chosen_at, list(pick)))  # parts in counters' order: units sorted
        self.measure_s += time.perf_counter() - t0

    def _set(self, unit: int, rungs: list[int]) -> None:
        ends = torch.tensor(self.ends[unit], dtype=torch.int64)
        self.core.set_parts(unit, ends, torch.tensor(rungs, dtype=torch.uint8))
        self.rungs[unit] = list(rungs)

    # ---- counters and checkpoints

    def _count(self, c: dict[str, Any]) -> None:
        super()._count(c)  # the codecs' counters first (warm-up fields)
        parts = []
        for u in sorted(self.rungs):
            start = 0
            for i, (end, r) in enumerate(zip(self.ends[u], self.rungs[u])):
                row = self.costs.get(u)
                cost = row[i][r] if row is not None and i < len(row) else None  # summed over ranks
                parts.append({"unit": u, "start": start, "end": end, "codec": self.ladder[r].name,
                              "bytes": cost.bytes if cost else None, "err_sq": cost.err_sq if cost else None})
                start = end
        # how the choice moved: each choice's rungs (indices into `ladder`), parts in `parts`' order
        history = [{"step": step, "rungs": rungs} for step, rungs in self.history]
        c["adaptive"] = {"chosen_at_step": self.chosen_at, "choose_time_s": self.measure_s, "parts": parts,
                         "ladder": [r.name for r in self.ladder], "history": history}

    def state_dict(self) -> dict[str, Any]:
        """method_state {"adaptive": {"version": 1, "chosen_at": step, "units": unit -> {"ends",
        "rungs"}}}: the tables, so a resumed run sends what it sent (the costs are measured anew)."""
        units = {u: {"ends": list(self.ends[u]), "rungs": list(self.rungs[u])} for u in sorted(self.rungs)}
        return {"method_state": {NAME: {"version": STATE_VERSION, "chosen_at": self.chosen_at, "units": units}}}

    def check(self, mine, units: list[int]) -> dict:
        """RankState.method_state's adaptive entry: each unit's table, its ends inside the unit."""
        part = (mine.method_state or {}).get(NAME)
        if part is None:
            return {"chosen_at": -1, "units": {}}
        if not isinstance(part, Mapping) or part.get("version") != STATE_VERSION:
            version = part.get("version") if isinstance(part, Mapping) else None
            raise ValueError(f"state_dict adaptive state has version {version!r}, this fsdpcomp reads "
                             f"version {STATE_VERSION}")
        out = {}
        for u, t in dict(part["units"]).items():
            u = int(u)
            ends, rungs = [int(e) for e in t["ends"]], [int(r) for r in t["rungs"]]
            if not 0 <= u < len(units) or not ends or ends[-1] != units[u] or len(ends) != len(rungs):
                raise ValueError(f"state_dict adaptive table of unit {u} does not fit it "
                                 f"({len(units)} units; ends {ends[-3:]}, rungs {len(rungs)})")
            if any(not 0 <= r < len(self.ladder) for r in rungs) or any(b <= a for a, b in zip(ends, ends[1:])):
                raise ValueError(f"state_dict adaptive table of unit {u}: rungs out of the ladder or ends not ascending")
            out[u] = (ends, rungs)
        return {"chosen_at": int(part.get("chosen_at", -1)), "units": out}

    def restore(self, checked: dict | None) -> None:
        """Takes check()'s result: every saved table set again (None: every unit exact until the
        next choice)."""
        self.ends, self.rungs, self.costs, self.norms = {}, {}, {}, {}
        self.measured_at = -1
        checked = checked or {"chosen_at": -1, "units": {}}
        self.chosen_at = checked["chosen_at"]
        for u, (ends, rungs) in checked["units"].items():
            self.ends[u] = ends
            self._set(u, rungs)
