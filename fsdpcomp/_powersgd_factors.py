"""PowerSGD (Vogels et al., NeurIPS 2019): each parameter's gradient M (n x m) sent as rank-r
factors. Per step: M += e (error feedback), P = M Q with last step's Q (warm start), all-reduce
P, orthogonalise P, Q = M^T P, all-reduce Q, mean = P Q^T, e = M - P Q^T. Vectors and matrices
too small to pay go exactly, in the first all-reduce beside the P's; so a unit costs two
all-reduces, whatever its number of matrices.

The factor arithmetic and what it keeps per unit (Q of each matrix), in torch ops (BLAS /
cuBLAS, CPU and CUDA alike); its residual e is the C State's, in the unit's "factors" slot, kept,
counted and checkpointed as every method's residual is. _powersgd.py makes it a Reducer: its
keys, its warm-up through the core's exchange, its counters and checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from ._dist import Ranks
from ._layout import Layout

_EPS = 1e-8  # Gram-Schmidt: a zero column (a matrix whose gradient is zero) stays finite


@dataclass(frozen=True)
class Config:
    rank: int
    start_iter: int
    min_compression_rate: float
    error_feedback: bool
    wire_bf16: bool


@dataclass(frozen=True)
class _Plan:
    """One (layout, size)'s compressed matrices and exactly-summed elements."""
    mats: tuple[tuple[int, int, int], ...]  # (offset in block, rows per block, cols), compressed
    exact: torch.Tensor | None  # bool mask over a block: summed exactly (None: nothing)
    exact_per_block: int
    groups: tuple[tuple[int, tuple[int, ...]], ...]  # (n, matrix indices): one batched Gram-Schmidt each


def _plan(layout: Layout | None, numel: int, rank: int, rate: float) -> _Plan:
    blocks = layout.blocks if layout is not None else 1
    if layout is None or numel % blocks:
        return _Plan((), torch.ones(numel, dtype=torch.bool), numel, ())
    blk = numel // blocks
    mats = []
    exact = torch.ones(blk, dtype=torch.bool)
    for off, rows, cols in layout.pieces:
        n = rows * blocks
        if rows <= 0 or cols <= 0 or off < 0 or off + rows * cols > blk:
            continue
        if n * cols >= rate * (n + cols) * rank:  # torch's _should_compress, with >=
            mats.append((off, rows, cols))
            exact[off:off + rows * cols] = False
    groups: dict[int, list[int]] = {}
    for j, (_, rows, _) in enumerate(mats):
        groups.setdefault(rows * blocks, []).append(j)
    k = int(exact.sum())
    return _Plan(tuple(mats), exact if k else None, k, tuple((n, tuple(js)) for n, js in groups.items()))


def orthogonalize(p: torch.Tensor) -> None:
    """Gram-Schmidt on the columns of each matrix of p (k x n x r), in place, in fp32: the same
    ops in the same order on every rank, so identical inputs give identical factors."""
    for i in range(p.shape[2]):
        col = p[:, :, i:i + 1]
        col.div_(torch.linalg.vector_norm(col, dim=1, keepdim=True).add_(_EPS))
        if i + 1 < p.shape[2]:
            rest = p[:, :, i + 1:]
            rest.sub_(col * (col * rest).sum(dim=1, keepdim=True))


def ring_bytes(numel: int, world: int, elem: int = 4) -> int:
    """What a ring all-reduce of numel elements sends per rank."""
    return 2 * (world - 1) * numel * elem // world


class Factors:
    """PowerSGD's arithmetic and state: per unit, Q per matrix (the residual e: the core's)."""

    def __init__(self, cfg: Config, seed: int, stats_every: int, core):
        self.cfg = cfg
        self._core = core  # the `none` _C.State: it keeps e (slot "factors") and packs an int8 one
        self._seed = seed
        self._stats_every = stats_every
        self.q: dict[int, list[torch.Tensor]] = {}
        self._plans: dict[tuple, _Plan] = {}
        self.reset_counts()

    def reset_counts(self) -> None:
        self.counts = {"calls": 0, "calls_uncompressed": 0, "elements": 0, "warmup_calls_exact": 0,
                       "warmup_steps_exact": 0, "err_sq": 0.0, "ref_sq": 0.0, "cos_sum": 0.0, "samples": 0}
        self._warm_step: int | None = None  # the step warmup_steps_exact counted last

    def signature(self, layout: Layout | None, numel: int) -> tuple:
        plan = self._plan_of(layout, numel)
        return (self.cfg.rank, self.cfg.start_iter, self.cfg.min_compression_rate,
                self.cfg.wire_bf16, layout.blocks if layout else 1, plan.mats)

    def _plan_of(self, layout: Layout | None, numel: int) -> _Plan:
        key = (layout, numel)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(layout, numel, self.cfg.rank, self.cfg.min_compression_rate)
        return plan

    def warming(self, step: int) -> bool:
        """A reduce-scatter of this step goes exactly, through the core's `none` exchange."""
        return step < self.cfg.start_iter

    def count_exact(self, step: int) -> None:
        """A call the core's `none` exchange made (warm-up): calls and elements are the core's."""
        self.counts["calls_uncompressed"] += 1
        self._count_warmup(step)

    def _count_warmup(self, step: int) -> None:
        """A call sent exact because of the warm-up, and its step once: a short run can go exact
        throughout (5 steps of the default start_iter 10 read as ratio 1.0) without this."""
        self.counts["warmup_calls_exact"] += 1
        if step != self._warm_step:
            self._warm_step = step
            self.counts["warmup_steps_exact"] += 1

    def _initial_q(self, unit: int, plan: _Plan, device: torch.device) -> list[torch.Tensor]:
        """Q of each matrix at a unit's first compressed step: seeded by (seed, unit, matrix), the
        same on every rank, drawn on the CPU so every device gets the same numbers."""
        qs = []
        for j, (_, _, cols) in enumerate(plan.mats):
            g = torch.Generator().manual_seed((self._seed * 1000003 + unit * 10007 + j) % (1 << 63))
            q = torch.randn(1, cols, self.cfg.rank, generator=g)
            orthogonalize(q)
            qs.append(q[0].to(device))
        return qs

    def reduce(self, grad: torch.Tensor, target: torch.Tensor, unit: int, ranks: Ranks,
               layout: Layout | None, step: int, scatter: bool,
               timed: Callable[..., None]) -> None:
        """target = the mean over ranks (scatter: this rank's chunk of it, grad.numel() / world
        elements; else the whole, target may be grad), for the unit the caller claimed."""
        world, n = ranks.world, grad.numel()
        esize = grad.element_size()
        shard = -(-n // world)
        raw = (world - 1) * shard * esize * (1 if scatter else 2)  # the uncompressed RS (+ AG)
        plan = self._plan_of(layout, n)
        self.counts["calls"] += 1
        self.counts["elements"] += n
        x = grad.detach().to(torch.float32, copy=True)
        if step < self.cfg.start_iter or not plan.mats:
            self.counts["calls_uncompressed"] += 1
            if step < self.cfg.start_iter:
                self._count_warmup(step)
            if world > 1:
                timed(lambda v: dist.all_reduce(v, group=ranks.group), x, bytes_sent=ring_bytes(n, world),
                      bytes_raw=raw, fallback=not plan.mats and step >= self.cfg.start_iter)
            x.div_(world)
            self._write(x, target, ranks, scatter)
            return
        blocks = layout.blocks
        xv = x.view(blocks, n // blocks)
        if self.cfg.error_feedback:  # g' = g + ef_decay e by the codecs' rules (none at the first step)
            self._core.ef_add(x, unit)
        r = self.cfg.rank
        mats = [xv[:, off:off + rows * cols].reshape(blocks * rows, cols) for off, rows, cols in plan.mats]
        qs = self.q.get(unit)
        if qs is None or len(qs) != len(mats) or any(q.shape != (m.shape[1], r) for q, m in zip(qs, mats)):
            qs = self._initial_q(unit, plan, x.device)
        qs = [q.to(x.device) for q in qs]
        sizes_p = [m.shape[0] * r for m in mats]
        first = torch.empty(sum(sizes_p) + blocks * plan.exact_per_block, dtype=torch.float32, device=x.device)
        ps, at = [], 0
        for m, q, size in zip(mats, qs, sizes_p):
            ps.append(first[at:at + size].view(m.shape[0], r))
            torch.matmul(m, q, out=ps[-1])
            at += size
        if plan.exact is not None:
            exact_mask = plan.exact.to(x.device)
            first[at:] = xv[:, exact_mask].reshape(-1)
        if world > 1:
            self._all_reduce(first, ranks, timed, bytes_raw=raw)
        for rows, js in plan.groups:  # batched Gram-Schmidt, one per height
            stacked = torch.stack([ps[j] for j in js])
            orthogonalize(stacked)
            for j, p in zip(js, stacked):
                ps[j].copy_(p)
        second = torch.empty(sum(m.shape[1] * r for m in mats), dtype=torch.float32, device=x.device)
        new_qs, at = [], 0
        for m, p in zip(mats, ps):
            new_qs.append(second[at:at + m.shape[1] * r].view(m.shape[1], r))
            torch.matmul(m.t(), p, out=new_qs[-1])
            at += m.shape[1] * r
        if self._stats_every and (self.counts["calls"] - 1) % self._stats_every == 0:
            self._sample(x, mats, ps, new_qs)
        if world > 1:
            self._all_reduce(second, ranks, timed, extra=True)
        second.div_(world)
        mean = torch.empty_like(xv)
        if plan.exact is not None:
            mean[:, exact_mask] = first[sum(sizes_p):].view(blocks, -1).div_(world)
        for (off, rows, cols), p, q in zip(plan.mats, ps, new_qs):
            mean[:, off:off + rows * cols] = (p @ q.t()).view(blocks, rows * cols)
        self.q[unit] = [q.clone() for q in new_qs]
        self._write(mean.view(-1), target, ranks, scatter)
        if self.cfg.error_feedback:
            # e = g' - mean by the codecs' residual rule; the exactly summed elements keep none:
            # what arrived of them is taken as g' itself (mean is written out, so it is free to
            # take that, with no copy)
            if plan.exact is not None:
                mean[:, exact_mask] = xv[:, exact_mask]
            self._core.ef_keep(x, mean.view(-1), unit)

    def _all_reduce(self, buf: torch.Tensor, ranks: Ranks, timed, **count) -> None:
        """Sums buf (fp32) over ranks in place, in factor_dtype on the wire; counted."""
        wire = buf.to(torch.bfloat16) if self.cfg.wire_bf16 else buf
        timed(lambda v: dist.all_reduce(v, group=ranks.group), wire,
              bytes_sent=ring_bytes(wire.numel(), ranks.world, wire.element_size()), **count)
        if wire is not buf:
            buf.copy_(wire)

    @staticmethod
    def _write(mean: torch.Tensor, target: torch.Tensor, ranks: Ranks, scatter: bool) -> None:
        if scatter:
            shard = target.numel()
            target.copy_(mean[ranks.rank * shard:(ranks.rank + 1) * shard])
        else:
            target.copy_(mean.view_as(target))

    def _sample(self, x, mats, ps, local_qs) -> None:
        """The compression error of this rank's own M against its own rank-r approximation
        P (P^T M) (before the Q all-reduce), over the compressed matrices; the exact elements add
        to ||x||^2 with no error, as the codecs' grad_rel_error counts them."""
        xx = float(x.double().pow(2).sum())
        ee = dd = 0.0
        xe = 0.0
        for m, p, q in zip(mats, ps, local_qs):
            d = p @ q.t()
            err = m - d
            ee += float(err.double().pow(2).sum())
            xe += float((m.double() * err.double()).sum())
        dd = xx - 2 * xe + ee
        xd = xx - xe
        c = self.counts
        c["err_sq"] += ee
        c["ref_sq"] += xx
        c["cos_sum"] += xd / math.sqrt(xx * dd) if xx > 0 and dd > 0 else float(xx == 0 and dd == 0)
        c["samples"] += 1

    def merge_counters(self, c: dict[str, Any]) -> None:
        """The counts kept here, into a counters() dict of the core's."""
        k = self.counts
        for key in ("calls", "calls_uncompressed", "elements"):
            c[key] += k[key]
        c["warmup_calls_exact"], c["warmup_steps_exact"] = k["warmup_calls_exact"], k["warmup_steps_exact"]
        if k["samples"]:
            c["grad_rel_error"] = math.sqrt(k["err_sq"] / k["ref_sq"]) if k["ref_sq"] > 0 else 0.0
            c["grad_cos_sim"] = k["cos_sum"] / k["samples"]
            c["error_samples"] = k["samples"]
        # residual_bytes is the core's (every slot); the norm of e, which the core's counters
        # read from the codecs' own work, is summed here
        c["residual_norm"] = math.sqrt(sum(float(self._values(e).pow(2).sum())
                                           for e in self._core.residuals("factors") if e is not None))

    def _values(self, e: torch.Tensor) -> torch.Tensor:
        """A kept e in fp32 (unpacked when residual_dtype is int8), for its norm."""
        if e.dtype != torch.uint8:
            return e.float()
        out = torch.empty(self._core.residual_values(e.numel()), dtype=torch.float32, device=e.device)
        self._core.unpack_residual(e, out)
        return out

    # ---- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Per unit: Q of each matrix (cloned)."""
        return {"q": {u: [q.detach().clone() for q in qs] for u, qs in self.q.items()}}

    @staticmethod
    def check(saved: Any, n_units: int) -> dict:
        """A checkpoint's Q factors, checked and copied; TypeError / ValueError naming what."""
        if not isinstance(saved, Mapping) or set(saved) != {"q"}:
            raise ValueError("state_dict 'powersgd' must be a dict with 'q' (Factors.state_dict())")
        table = saved["q"]
        if not isinstance(table, Mapping):
            raise TypeError("state_dict 'powersgd'['q'] must be a dict of unit -> tensors")
        copied = {}
        for u, v in table.items():
            if isinstance(u, bool) or not isinstance(u, int) or not 0 <= u < n_units:
                raise ValueError(f"state_dict 'powersgd'['q'] is keyed by unit (0 to {n_units - 1}), got {u!r}")
            if not isinstance(v, (list, tuple)) or not all(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in v):
                raise TypeError(f"state_dict 'powersgd'['q'][{u}] must hold float tensors")
            if not all(bool(torch.isfinite(t.float()).all()) for t in v):
                raise ValueError(f"state_dict 'powersgd'['q'][{u}] holds NaN/Inf (a corrupted checkpoint?)")
            copied[u] = [t.detach().clone() for t in v]
        return copied

    def restore(self, q: dict) -> None:
        self.q = q
