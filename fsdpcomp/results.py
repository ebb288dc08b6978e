"""results.jsonl: one JSON line per training run, built from CommState counters and the training
script's own measurements, appended in a single write so concurrent runs never interleave."""
from __future__ import annotations

import json
import math
import os
import platform
from typing import Any, Iterable, Mapping, Sequence

from ._version import __version__

# Fields every line carries (null where the value could not be measured on this setup).
REQUIRED_FIELDS = (
    "run_name", "world_size", "model", "dataset", "max_length", "batch_size", "compress_method",
    "compress_config", "seed", "step_time_ms_mean", "step_time_ms_p50", "step_time_ms_p90",
    "tokens_per_s", "comm_time_ms_total", "comm_ratio", "comm_time_ms_by_op", "bytes_raw_total",
    "bytes_compressed_total", "compression_ratio", "train_loss", "val_loss", "val_ppl",
)
OPTIONAL_FIELDS = (
    "compress_time_ms", "decompress_time_ms", "extra_collectives", "extra_collective_time_ms",
    "fallback_units", "index_bytes", "density", "residual_norm", "grad_rel_error", "grad_cos_sim",
    "mem_peak_alloc_gb", "mem_peak_reserved_gb", "time_to_target_ppl_s", "ppl_at_fixed_time",
    "nonfinite_steps", "saturated", "torch_version", "fsdpcomp_version", "device",
    "param_gather_calls", "param_gather_bytes_raw_total", "param_gather_bytes_sent_total",
    "param_gather_ratio", "param_gather_time_ms", "param_gather_codec_time_ms",
    "warmup_steps_exact", "warmup_calls_exact", "residual_bytes_by_rank", "buffer_bytes_by_rank",
    "buffer_peak_bytes_by_rank", "scratch_bytes_by_rank",
)
COMM_OPS = ("reduce_scatter", "all_gather", "all_to_all", "all_reduce")

# How counters from several ranks combine: byte and event counts add up, times and
# per-rank statistics are averaged over the ranks that have a value; steps every rank counts
# alike (powersgd's exact warm-up steps) are the largest count, not a sum.
_SUMMED = ("calls", "calls_uncompressed", "warmup_calls_exact", "fallback_units", "elements", "chunks_sent",
           "bytes_raw", "bytes_sent", "bytes_compressed", "header_bytes", "meta_bytes", "index_bytes",
           "value_bytes", "nonfinite_in", "nonfinite_out", "saturated", "extra_collectives", "error_samples",
           "residual_bytes", "buffer_bytes", "scratch_bytes", "param_gather_calls", "param_gather_bytes_raw",
           "param_gather_bytes_sent")
_AVERAGED = ("compress_time_s", "decompress_time_s", "comm_time_s", "extra_collective_time_s",
             "grad_rel_error", "grad_cos_sim", "residual_norm", "density", "param_gather_time_s",
             "param_gather_codec_time_s")
_MAXED = ("warmup_steps_exact",)
# What a rank holds: its own memory, so also kept per rank (a list in rank order), since the
# sum over ranks hides the rank that runs out first.
_BY_RANK = ("residual_bytes", "buffer_bytes", "buffer_peak_bytes", "scratch_bytes")
_TIMES = ("compress_time_s", "decompress_time_s", "comm_time_s", "extra_collective_time_s",
          "param_gather_time_s", "param_gather_codec_time_s")


def combine_counters(per_rank: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One dict from each rank's counters (``CommState.counters()``, in rank order): sums and
    means as above, and ``<key>_by_rank`` lists of the memory held. ``ratio`` is recomputed
    from the summed bytes; ``density`` is the elementwise mean."""
    if not per_rank:
        raise ValueError("combine_counters needs the counters of at least one rank")
    out: dict[str, Any] = {"method": per_rank[0].get("method"), "ranks": len(per_rank)}
    for key in _SUMMED:
        vals = [c[key] for c in per_rank if c.get(key) is not None]
        out[key] = sum(vals) if vals else None
    for key in _AVERAGED:
        vals = [float(c[key]) for c in per_rank if c.get(key) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    for key in _MAXED:
        vals = [c[key] for c in per_rank if c.get(key) is not None]
        out[key] = max(vals) if vals else None
    for key in _BY_RANK:
        out[key + "_by_rank"] = [c.get(key) for c in per_rank]
    raw, sent = out.get("bytes_raw"), out.get("bytes_compressed")
    out["ratio"] = (raw / sent) if raw and sent else None
    if per_rank[0].get("adaptive") is not None:  # adaptive's tables: every rank sets the same
        out["adaptive"] = per_rank[0]["adaptive"]
    return out


def subtract_times(end: Mapping[str, Any], start: Mapping[str, Any] | None) -> dict[str, Any]:
    """The timing counters accrued between two snapshots (to leave warm-up steps out)."""
    out = dict(end)
    if start is not None:
        for key in _TIMES:
            if end.get(key) is not None and start.get(key) is not None:
                out[key] = end[key] - start[key]
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _finite_or_none(x: Any) -> Any:
    """JSON has no NaN/Inf: a non-finite measurement is written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else float(seconds) * 1000.0


def build_record(*, run: Mapping[str, Any], step_times_s: Iterable[float], tokens_per_step: int,
                 counters: Mapping[str, Any], comm_time_ms_by_op: Mapping[str, float | None] | None = None,
                 measured_ms: Mapping[str, float | None] | None = None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A results line.

    run: run_name, world_size, model, dataset, max_length, batch_size, compress_method,
        compress_config, seed, train_loss, val_loss, val_ppl (and any optional field measured
        by the script, e.g. mem_peak_alloc_gb, time_to_target_ppl_s, nonfinite_steps, device).
    step_times_s: wall time of each timed step (warm-up steps already left out).
    tokens_per_step: tokens processed per step over all ranks.
    counters: ``combine_counters`` of all ranks, timing fields over the timed steps only.
    comm_time_ms_by_op: per-op communication time (ms, over the timed steps) when a profiler
        measured it; otherwise the library's own exchanges from the counters (the compressed
        reduce-scatter under all_to_all; FSDP2's parameter all-gathers through fsdpcomp.AllGather,
        codec time left out, under all_gather), then what the script timed itself for the ops
        still unmeasured (measured_ms, e.g. FSDP's own parameter all-gathers), and null for the
        ops nobody measured.
    """
    missing = [k for k in ("run_name", "world_size", "model", "dataset", "max_length", "batch_size",
                           "compress_method", "compress_config", "seed") if k not in run]
    if missing:
        raise ValueError(f"build_record: run is missing {', '.join(missing)}")
    times = [float(t) for t in step_times_s]
    total_s = sum(times)
    gathers = counters.get("param_gather_calls") or 0  # 0: FSDP1/DDP, or no fsdpcomp.AllGather
    if comm_time_ms_by_op is None:
        rs = counters.get("comm_time_s")
        comm_time_ms_by_op = {op: None for op in COMM_OPS}
        comm_time_ms_by_op["all_to_all"] = _ms(rs)  # the hook's compressed exchanges
        if gathers:  # like the reduce-scatter's: the time outside the codec
            comm_time_ms_by_op["all_gather"] = _ms(counters["param_gather_time_s"] - counters["param_gather_codec_time_s"])
        for op, ms in (measured_ms or {}).items():
            if comm_time_ms_by_op.get(op) is None:
                comm_time_ms_by_op[op] = ms
    by_op = {op: _finite_or_none(comm_time_ms_by_op.get(op)) for op in COMM_OPS}
    measured = [v for v in by_op.values() if v is not None]
    extra_ms = _ms(counters.get("extra_collective_time_s"))
    comm_total = (sum(measured) + (extra_ms or 0.0)) if measured else None
    raw, sent = counters.get("bytes_raw"), counters.get("bytes_compressed")
    rec: dict[str, Any] = {k: run.get(k) for k in REQUIRED_FIELDS}
    rec.update(
        step_time_ms_mean=(total_s / len(times) * 1000.0) if times else None,
        step_time_ms_p50=_ms(percentile(times, 50)),
        step_time_ms_p90=_ms(percentile(times, 90)),
        tokens_per_s=(tokens_per_step * len(times) / total_s) if total_s > 0 else None,
        comm_time_ms_total=comm_total,
        comm_ratio=(comm_total / (total_s * 1000.0)) if comm_total is not None and total_s > 0 else None,
        comm_time_ms_by_op=by_op,
        bytes_raw_total=raw,
        bytes_compressed_total=sent,
        compression_ratio=(raw / sent) if raw and sent else None,
        compress_time_ms=_ms(counters.get("compress_time_s")),
        decompress_time_ms=_ms(counters.get("decompress_time_s")),
        extra_collectives=counters.get("extra_collectives"),
        extra_collective_time_ms=extra_ms,
        fallback_units=counters.get("fallback_units"),
        index_bytes=counters.get("index_bytes"),
        density=counters.get("density"),
        residual_norm=counters.get("residual_norm"),
        grad_rel_error=counters.get("grad_rel_error"),
        grad_cos_sim=counters.get("grad_cos_sim"),
        saturated=counters.get("saturated"),
        warmup_steps_exact=counters.get("warmup_steps_exact"),
        warmup_calls_exact=counters.get("warmup_calls_exact"),
        **{k + "_by_rank": counters.get(k + "_by_rank") for k in _BY_RANK},
    )
    if gathers:
        ag_raw, ag_sent = counters.get("param_gather_bytes_raw"), counters.get("param_gather_bytes_sent")
        rec.update(param_gather_calls=gathers, param_gather_bytes_raw_total=ag_raw,
                   param_gather_bytes_sent_total=ag_sent,
                   param_gather_ratio=(ag_raw / ag_sent) if ag_raw and ag_sent else None,
                   param_gather_time_ms=_ms(counters.get("param_gather_time_s")),
                   param_gather_codec_time_ms=_ms(counters.get("param_gather_codec_time_s")))
    if counters.get("adaptive") is not None:  # the choice: each part's codec, bytes and error
        rec["adaptive"] = counters["adaptive"]
    for key in OPTIONAL_FIELDS:
        rec.setdefault(key, run.get(key))
    rec.update({k: v for k, v in run.items() if k not in rec})
    rec.update(extra or {})
    rec.setdefault("torch_version", None)
    if rec["torch_version"] is None:
        try:
            import torch
            rec["torch_version"] = torch.__version__
        except ImportError:
            pass
    if rec.get("fsdpcomp_version") is None:
        rec["fsdpcomp_version"] = __version__
    rec.setdefault("python_version", platform.python_version())
    return {k: _finite_or_none(v) for k, v in rec.items()}


def append_result(path: str | os.PathLike, record: Mapping[str, Any]) -> str:
    """Appends the record as one line with a single write on an O_APPEND descriptor (lines
    from concurrent writers never interleave). Returns the line written."""
    line = json.dumps(record, allow_nan=False, sort_keys=False) + "\n"
    data = line.encode("utf-8")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
    finally:
        os.close(fd)
    return line


def read_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every line of a results.jsonl (blank lines skipped; a bad line raises naming its number)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                rows.append(json.loads(text))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n} is not valid JSON ({e.msg})") from None
    return rows
