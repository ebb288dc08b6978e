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


KERNELS_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu", "kernels_cuda.json")


class NoKernelTimes(ValueError):
    """A method the projection was asked for has no measured GPU codec row: projecting it with a
    codec time of 0 would claim a speedup nothing measured."""


def _run_info(data: dict, run) -> dict:
    """What the kernels file says of `run`: date, commit, device (None where it has no record)."""
    for r in data.get("runs", []):
        if r.get("run") == run:
            return {"run": run, "date": r.get("updated"), "commit": r.get("commit"), "device": r.get("device")}
    return {"run": run, "date": data.get("date"), "commit": data.get("commit"), "device": data.get("device")}


def describe(info: dict) -> str:
    """'run 2 (2026-11-28, commit 04439df, NVIDIA H200) of PATH', every part said even when unknown."""
    run = "the rows" if info.get("run") is None else f"run {info['run']}"
    date = (info.get("date") or "date not recorded")[:10]
    commit = f"commit {info['commit']}" if info.get("commit") else "commit not recorded"
    return f"{run} ({date}, {commit}, {info.get('device') or 'device not recorded'}) of {info.get('path')}"


def load_gpu_kernels(path: str | None = None, run: int | None = None) -> tuple[dict[str, dict], dict]:
    """GPU codec times per method from benchmarks/kernels_cuda.py's table (as tests/gpu/collect.py
    keeps it: rows of several runs, each with its "run"): {method: {"encode_s_per_elem",
    "decode_s_per_elem", "numel", "device"}} from the rows of one run (the newest unless `run`
    names one) that time a method at its defaults (the row labelled with the bare method name,
    no error feedback, checked against the CPU), each at the largest size that run timed it at
    (the fixed cost per call amortised); and the run's record (run, date, commit, device, path).
    FileNotFoundError without the file, ValueError when it has no such row or no run `run`."""
    path = path or KERNELS_JSON
    if not os.path.exists(path):
        raise FileNotFoundError(f"no GPU kernel table at {path}: run benchmarks/kernels_cuda.py on a GPU "
                                "(tests/gpu/run.sh quick) and collect it (tests/gpu/collect.py)")
    with open(path) as f:
        data = json.load(f)
    rows = data.get("rows", []) if isinstance(data, dict) else data
    data = data if isinstance(data, dict) else {}
    timed = [r for r in rows if isinstance(r, dict) and r.get("method") != "d2d copy"
             and r.get("enc_ms") is not None and r.get("dec_ms") is not None
             and r.get("status", "passed") == "passed" and not r.get("wrong") and not r.get("ef")
             and r.get("variant", "plain") == "plain" and r.get("n", r.get("numel", 0)) > 0]
    runs = sorted({r.get("run") for r in timed if r.get("run") is not None})
    if run is None:
        run = runs[-1] if runs else None
    elif run not in runs:
        raise ValueError(f"{path} has no timed kernel rows of run {run} (its runs: {runs or 'none recorded'})")
    info = dict(_run_info(data, run), path=path)
    best: dict[str, dict] = {}
    for row in timed:
        if row.get("run") != run:
            continue
        n = row.get("n", row.get("numel"))
        prev = best.get(row["method"])
        if prev is None or n > prev["numel"]:
            best[row["method"]] = {"numel": n, "encode_s_per_elem": row["enc_ms"] / 1e3 / n,
                                   "decode_s_per_elem": row["dec_ms"] / 1e3 / n, "device": info["device"]}
    if not best:
        raise ValueError(f"{path} has no timed kernel rows to project with")
    return best, info


def load_kernel_times(path: str | None) -> tuple[dict[str, dict], str]:
    """comm_bench.py's form: (the newest run's codec times, a note naming that run), or ({}, why
    not) when there is no usable file: its projection is then the codec-time-0 bound, said so."""
    try:
        kernels, info = load_gpu_kernels(path)
    except (OSError, ValueError) as e:
        return {}, f"needs GPU kernel times: {e}"
    return kernels, f"GPU codec times from {describe(info)}"


def require(kernels: dict[str, dict], methods, info: dict) -> None:
    """NoKernelTimes naming every method of `methods` without a measured row."""
    missing = [m for m in methods if m not in kernels]
    if missing:
        raise NoKernelTimes(f"no measured GPU codec time for {', '.join(missing)} in {describe(info)} "
                            f"(it has {', '.join(sorted(kernels))}): time them with benchmarks/kernels_cuda.py, "
                            "or project without them")


def cluster_table(ratios: dict[str, float], kernels: dict[str, dict] | None, numel: int,
                  worlds: list[int], gbits: list[float], alpha_s: float, info: dict | None = None) -> list[dict]:
    """Projected reduce-scatter time of a `numel`-element fp32 gradient per GPU, for each method
    whose measured compression ratio is known, with its measured GPU codec times (`kernels`:
    NoKernelTimes for a method without one, `info` naming where they came from). No kernels
    (None or {}): no codec time at all (the codec costs 0, a bound, said so wherever the rows are
    shown: `kernel_times` False)."""
    if kernels:
        require(kernels, ratios, info or {"path": "the kernel times given"})
    rows = []
    for gbit in gbits:
        for world in worlds:
            raw = (world - 1) / world * numel * 4
            nccl = ring_rs_time(numel, 4, world, gbit, alpha_s)
            t_none = alltoall_time(raw, world, gbit, alpha_s)
            for method, ratio in ratios.items():
                k = kernels.get(method) if kernels else None
                enc = k["encode_s_per_elem"] * numel * (world - 1) / world if k else 0.0
                dec = k["decode_s_per_elem"] * numel / world * (world - 1) if k else 0.0
                t = alltoall_time(raw / ratio, world, gbit, alpha_s, enc, dec)
                rows.append({"gbit": gbit, "world": world, "method": method, "ratio": ratio,
                             "time_s": t, "speedup_vs_nccl_rs": nccl / t, "speedup_vs_none": t_none / t,
                             "kernel_times": bool(k)})
    return rows


def from_comm(cluster: dict, kernels: dict[str, dict], info: dict) -> tuple[list[dict], list[str]]:
    """comm_bench.json's cluster projection (its measured ratios, GPU counts, links and alpha)
    again, with GPU codec times: the rows of the methods `kernels` has, and the methods it has not
    (left out, not projected at codec time 0)."""
    ratios = {r["method"]: r["ratio"] for r in cluster["rows"]}
    have = {m: v for m, v in ratios.items() if m in kernels}
    worlds = sorted({r["world"] for r in cluster["rows"]})
    gbits = sorted({r["gbit"] for r in cluster["rows"]})
    rows = cluster_table(have, kernels, cluster["numel"], worlds, gbits, cluster["alpha_us"] * 1e-6, info)
    return rows, [m for m in ratios if m not in kernels]


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


def main(argv=None) -> int:
    """The GPU-cluster projection of comm_bench.json's measured ratios with the GPU codec times of
    one run of the kernel table, printed; exit 2 when a method asked for has no measured row."""
    import argparse
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--kernels", default=KERNELS_JSON, help="the kernel table (benchmarks/kernels_cuda.py's JSON, "
                    "as tests/gpu/collect.py keeps it)")
    ap.add_argument("--run", type=int, default=None, help="the run of the kernel table (default: its newest)")
    ap.add_argument("--comm", default=os.path.join(here, "results", "comm_bench.json"),
                    help="comm_bench.json: the measured ratios, GPU counts, links and alpha")
    ap.add_argument("--methods", default="", help="comma-separated methods; each must have a measured row "
                    "(default: every method of --comm that has one, the others named)")
    args = ap.parse_args(argv)
    try:
        kernels, info = load_gpu_kernels(args.kernels, args.run)
        with open(args.comm) as f:
            cluster = json.load(f)["cluster"]
        if args.methods:
            want = args.methods.split(",")
            require(kernels, want, info)
            cluster = dict(cluster, rows=[r for r in cluster["rows"] if r["method"] in want])
            unknown = [m for m in want if m not in {r["method"] for r in cluster["rows"]}]
            if unknown:
                raise ValueError(f"{args.comm} has no measured ratio for {', '.join(unknown)}")
        rows, left_out = from_comm(cluster, kernels, info)
    except (OSError, ValueError, KeyError) as e:
        print(f"projection: {e}", file=sys.stderr)
        return 2
    print(f"PROJECTED reduce-scatter for GPU clusters (alpha-beta, not measured): {cluster['numel']} fp32 elements "
          f"per GPU, alpha {cluster['alpha_us']:g} us, ratios measured by {args.comm}; GPU codec times from "
          f"{describe(info)}")
    if left_out:
        print(f"not projected (no measured GPU codec row in that run): {', '.join(left_out)}")
    print(f"{'Gbit/s':>7}{'GPUs':>6}  {'method':<12}{'ratio':>9}{'ms':>9}{'vs NCCL rs':>12}{'vs none':>9}")
    for r in rows:
        print(f"{r['gbit']:>7.0f}{r['world']:>6}  {r['method']:<12}{r['ratio']:>9.2f}{r['time_s'] * 1e3:>9.2f}"
              f"{r['speedup_vs_nccl_rs']:>12.2f}{r['speedup_vs_none']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
