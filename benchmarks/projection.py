# The alpha-beta model: time of a (compressed) reduce-scatter on a link we did not measure, from measured codec times and bytes.
"""t = encode + decode + alpha * messages + bytes_on_the_wire / bandwidth, per rank, with one
NIC per rank (full duplex). Every number this file produces is a projection and is labelled so
wherever it is printed."""
from __future__ import annotations

import json
import os

# torch's reduce_scatter on gloo moves as many bytes as a ring all-reduce (see comm_bench's
# wire-byte check); NCCL's ring reduce-scatter moves (W-1)/W of the data once.
GLOO_RS_FACTOR = 2.0


def alltoall_time(bytes_sent: float, world: int, gbit: float, alpha_s: float,
                  encode_s: float = 0.0, decode_s: float = 0.0) -> float:
    """fsdpcomp's path: W-1 payloads out and W-1 in, each rank limited by its own link."""
    return encode_s + decode_s + (world - 1) * alpha_s + bytes_sent * 8 / (gbit * 1e9)


def ring_rs_time(numel: int, elem_bytes: int, world: int, gbit: float, alpha_s: float,
                 factor: float = 1.0) -> float:
    """A ring reduce-scatter (factor 2: a ring all-reduce) of `numel` elements."""
    wire = factor * (world - 1) / world * numel * elem_bytes
    return factor * (world - 1) * alpha_s + wire * 8 / (gbit * 1e9)


def load_kernel_times(path: str | None) -> tuple[dict[str, dict], str]:
    """GPU codec times from benchmarks/kernels.py's JSON, as seconds per element:
    {method: {"encode_s_per_elem", "decode_s_per_elem", "device"}}, and a note on where they came
    from. Accepts rows {"method", "numel", and "encode_ms"/"decode_ms" or "encode_s"/"decode_s"}
    under a top-level "rows" list (or a bare list). Returns ({}, reason) when there is no file."""
    if not path or not os.path.exists(path):
        return {}, f"needs GPU kernel times: no {path or 'kernels JSON'} (run benchmarks/kernels.py on a GPU)"
    with open(path) as f:
        data = json.load(f)
    rows = data.get("rows", []) if isinstance(data, dict) else data
    device = data.get("device", "unknown GPU") if isinstance(data, dict) else "unknown GPU"
    best: dict[str, dict] = {}
    for row in rows:
        if not isinstance(row, dict) or "method" not in row or "numel" not in row:
            continue
        enc = row.get("encode_s", row["encode_ms"] / 1e3 if "encode_ms" in row else None)
        dec = row.get("decode_s", row["decode_ms"] / 1e3 if "decode_ms" in row else None)
        if enc is None or dec is None or row["numel"] <= 0:
            continue
        prev = best.get(row["method"])
        if prev is None or row["numel"] > prev["numel"]:  # the largest size: launch overhead amortised
            best[row["method"]] = {"numel": row["numel"], "encode_s_per_elem": enc / row["numel"],
                                   "decode_s_per_elem": dec / row["numel"],
                                   "device": row.get("device", device)}
    if not best:
        return {}, f"needs GPU kernel times: {path} has no usable rows"
    return best, f"GPU kernel times from {path} ({next(iter(best.values()))['device']})"


def cluster_table(ratios: dict[str, float], kernels: dict[str, dict], numel: int,
                  worlds: list[int], gbits: list[float], alpha_s: float) -> list[dict]:
    """Projected reduce-scatter time of a `numel`-element fp32 gradient per GPU, for each method
    whose measured compression ratio is known. Without kernel times the codec costs 0: a bound."""
    rows = []
    for gbit in gbits:
        for world in worlds:
            raw = (world - 1) / world * numel * 4
            nccl = ring_rs_time(numel, 4, world, gbit, alpha_s)
            t_none = alltoall_time(raw, world, gbit, alpha_s)
            for method, ratio in ratios.items():
                k = kernels.get(method)
                enc = k["encode_s_per_elem"] * numel * (world - 1) / world if k else 0.0
                dec = k["decode_s_per_elem"] * numel / world * (world - 1) if k else 0.0
                t = alltoall_time(raw / ratio, world, gbit, alpha_s, enc, dec)
                rows.append({"gbit": gbit, "world": world, "method": method, "ratio": ratio,
                             "time_s": t, "speedup_vs_nccl_rs": nccl / t, "speedup_vs_none": t_none / t,
                             "kernel_times": bool(k)})
    return rows


# What one training step of the reference model costs on one GPU, for the step projection. These
# are assumptions, printed with every table that uses them: gpt2-62m's parameters, 8 sequences
# of 1024 tokens per GPU, an H100's dense bf16 peak and a 40% model-FLOPs utilisation.
STEP_TOKENS = 8 * 1024
STEP_PEAK_TFLOPS = 989.0
STEP_MFU = 0.40


def compute_time(params: int, tokens: int = STEP_TOKENS, peak_tflops: float = STEP_PEAK_TFLOPS,
                 mfu: float = STEP_MFU) -> float:
    """Forward + backward of a transformer: 6 FLOPs per parameter per token."""
    return 6.0 * params * tokens / (peak_tflops * 1e12 * mfu)


def step_caption(numel: int, compute_s: float) -> str:
    return (f"PROJECTED step speedup over the same FSDP step with NCCL's reduce-scatter (not measured): "
            f"{numel} parameters, compute {compute_s * 1e3:.1f} ms = 6 x params x {STEP_TOKENS} tokens / "
            f"({STEP_PEAK_TFLOPS:g} TFLOP/s x {STEP_MFU:.0%} MFU), plus two fp32 parameter all-gathers "
            f"(forward and backward), uncompressed or (`+ gathers`) int8 (`param_gather`); 'no overlap' adds "
            f"compute and communication, 'overlap' hides the smaller")


def gather_time(numel: int, world: int, gbit: float, alpha_s: float, ratio: float = 1.0,
                kernel: dict | None = None) -> float:
    """One FSDP parameter all-gather of `numel` fp32 parameters (a ring moves what a reduce-scatter
    does), its payloads `ratio` times smaller; with a codec (`param_gather`), each rank encodes
    its shard and decodes all W shards, at `kernel`'s times per element (0 without them)."""
    codec = 0.0
    if kernel:
        codec = kernel["encode_s_per_elem"] * numel / world + kernel["decode_s_per_elem"] * numel
    return ring_rs_time(numel, 4 / ratio, world, gbit, alpha_s) + codec


def step_table(cluster_rows: list[dict], numel: int, alpha_s: float, compute_s: float,
               gather_ratio: float | None = None, gather_kernel: dict | None = None) -> list[dict]:
    """Projected FSDP step time per cluster row: compute, two fp32 parameter all-gathers
    (forward and backward) and the gradient reduce-scatter, either one after the other (no
    overlap: the bound a slow link hits) or hidden behind compute (full overlap). The baseline
    is the same step with NCCL's ring reduce-scatter and uncompressed all-gathers. With
    `gather_ratio` (the int8 parameter codec's, from a measured payload), each row also gets the
    step whose all-gathers are compressed too (`*_gathers`)."""
    rows = []
    for c in cluster_rows:
        world, gbit = c["world"], c["gbit"]
        rs_nccl = ring_rs_time(numel, 4, world, gbit, alpha_s)
        ag = 2 * gather_time(numel, world, gbit, alpha_s)
        base_serial, mine_serial = compute_s + ag + rs_nccl, compute_s + ag + c["time_s"]
        base_overlap, mine_overlap = max(compute_s, ag + rs_nccl), max(compute_s, ag + c["time_s"])
        row = {"gbit": gbit, "world": world, "method": c["method"], "ratio": c["ratio"],
               "step_s": mine_serial, "speedup_no_overlap": base_serial / mine_serial,
               "speedup_full_overlap": base_overlap / mine_overlap}
        if gather_ratio:
            ag_c = 2 * gather_time(numel, world, gbit, alpha_s, gather_ratio, gather_kernel)
            row.update(step_s_gathers=compute_s + ag_c + c["time_s"],
                       speedup_no_overlap_gathers=base_serial / (compute_s + ag_c + c["time_s"]),
                       speedup_full_overlap_gathers=base_overlap / max(compute_s, ag_c + c["time_s"]))
        rows.append(row)
    return rows
