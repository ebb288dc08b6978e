"""torch.profiler over chosen steps: traces for TensorBoard plus a per-step summary of
communication time by collective (reduce_scatter / all_gather / all_to_all / all_reduce) versus
compute."""
from __future__ import annotations

import json
import os
import re

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

OPS = ("reduce_scatter", "all_gather", "all_to_all", "all_reduce")
# Host-side names of the c10d collectives (gloo and NCCL) and device-side NCCL kernel names.
_PATTERNS = {
    "reduce_scatter": re.compile(r"reduce_?scatter", re.I),
    "all_gather": re.compile(r"all_?gather", re.I),
    "all_to_all": re.compile(r"all_?to_?all|alltoall|SendRecv", re.I),
    "all_reduce": re.compile(r"all_?reduce", re.I),
}
# The step ranges ("ProfilerStep#N" while recording; events() renames them "ProfilerStep*").
_STEP = re.compile(r"^ProfilerStep[#*]")


def parse_steps(spec: str, first: int, max_steps: int) -> tuple[int, int]:
    """'N' (N steps from `first`) or 'A:B' (steps A..B-1) -> (start, end)."""
    try:
        if ":" in spec:
            a, b = (int(x) for x in spec.split(":", 1))
        else:
            a, b = first, first + int(spec)
    except ValueError:
        raise ValueError(f"--profile_steps must be N or A:B, got {spec!r}") from None
    if not 0 <= a < b <= max_steps:
        raise ValueError(f"--profile_steps {spec!r} gives steps {a}..{b - 1}, outside 0..{max_steps - 1}")
    return a, b


def make_profiler(trace_dir: str, start: int, end: int, cuda: bool) -> profile:
    """Step the profiler once per training step from step 0; it records steps start..end-1."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    os.makedirs(trace_dir, exist_ok=True)
    return profile(activities=acts, schedule=schedule(wait=max(start - 1, 0), warmup=min(start, 1),
                                                      active=end - start, repeat=1),
                   on_trace_ready=tensorboard_trace_handler(trace_dir), record_shapes=False)


def _classify(name: str) -> str | None:
    for op, pat in _PATTERNS.items():
        if pat.search(name):
            return op
    return None


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _clip(iv, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in iv if min(b, hi) > max(a, lo)]


def summarize(prof: profile, first_step: int) -> list[dict]:
    """Per profiled step: its wall time, the time under each collective (nested events and
    overlaps counted once: union of intervals), all communication, and the rest as compute.
    Host events are used on CPU; on GPU the NCCL kernels' device time. Steps are numbered
    from first_step in time order."""
    events = prof.events()
    steps, comm = [], {op: [] for op in OPS}
    use_device = any(getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and "nccl" in e.name.lower()
                     for e in events)
    for e in events:
        if _STEP.match(e.name):
            steps.append((e.time_range.start, e.time_range.end))
            continue
        op = _classify(e.name)
        if op is None:
            continue
        on_device = getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        if use_device != on_device:
            continue
        comm[op].append((e.time_range.start, e.time_range.end))
    rows = []
    for step, (lo, hi) in enumerate(sorted(steps), first_step):
        wall = hi - lo
        by_op = {op: _union(_clip(comm[op], lo, hi)) for op in OPS}
        all_comm = _union([iv for op in OPS for iv in _clip(comm[op], lo, hi)])
        compute = max(wall - all_comm, 0.0)
        rows.append({
            "step": step, "step_ms": wall / 1e3,
            "comm_ms": all_comm / 1e3, "comm_share": all_comm / wall if wall else None,
            "compute_ms": compute / 1e3, "compute_share": compute / wall if wall else None,
            "by_op_ms": {op: v / 1e3 for op, v in by_op.items()},
            "by_op_share": {op: (v / wall if wall else None) for op, v in by_op.items()},
        })
    return rows


def totals_ms(rows: list[dict]) -> dict[str, float]:
    return {op: sum(r["by_op_ms"][op] for r in rows) for op in OPS}


def table(rows: list[dict]) -> str:
    head = f"{'step':>5} {'step ms':>9} {'compute':>14} {'comm':>14}" + "".join(f" {op:>16}" for op in OPS)
    lines = [head]
    for r in rows:
        cells = "".join(f" {r['by_op_ms'][op]:8.1f} ({r['by_op_share'][op]:4.0%})" for op in OPS)
        lines.append(f"{r['step']:>5} {r['step_ms']:9.1f} {r['compute_ms']:7.1f} ({r['compute_share']:4.0%})"
                     f" {r['comm_ms']:7.1f} ({r['comm_share']:4.0%})" + cells)
    return "\n".join(lines)


def save(rows: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"steps": rows, "totals_ms": totals_ms(rows)}, f, indent=1)
