# The GPU section of docs/results.md: the GPU plan's checks and the CUDA kernel table, from benchmarks/results/gpu/.
"""Used by make_results_md.py; only numbers found in the JSON are written. The files come from
tests/gpu/collect.py over what tests/gpu/run.sh wrote on a GPU machine (tests/gpu/README.md)."""
from __future__ import annotations

import json
import os

from fmt import fmt, md_table

RUN_CMD = "bash tests/gpu/run.sh prepare (here), then bash tests/gpu/run.sh quick and rest on the GPU machine"


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _checks_lines(summary: dict) -> list[str]:
    out = [f"Device: {summary.get('device')}. Runs, in order:", ""]
    for r in summary["runs"]:
        out.append(f"- run {r['run']} ({r.get('updated')}, torch {r.get('torch')}, NCCL {r.get('nccl')}): "
                   f"{r.get('note') or '(no note)'}")
    counts = summary.get("counts", {})
    out += ["", "Checks, each as its latest run left it: " +
            ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "skipped")) + ".", ""]
    rows = []
    for name, r in sorted(summary["checks"].items()):
        why = (r.get("error") or r.get("reason") or "").replace("|", "/").replace("\n", " ")
        rows.append([f"`{name}`", r["status"], fmt(r.get("seconds"), ".1f"), str(r.get("run")), why[:140]])
    return out + md_table(["check", "status", "s", "run", "why"], rows) + [""]


def _kernel_lines(kernels: dict) -> list[str]:
    out = [f"Device {kernels.get('device')}, torch {kernels.get('torch')}; encode and decode-accumulate of "
           "one rank's gradient (W = 1, own chunk compressed, no error feedback), GB/s of the bytes each "
           "kernel must move, and that as a share of the device-to-device copy timed in the same run "
           "(copy: 2 x 4n bytes). Targets: quantisers >= 80% of copy, selection >= 25%; reported, not "
           "enforced. Every row was checked against the CPU first (payload bytes, decoded bits): `wrong` "
           "counts the differences.", ""]
    rows = []
    for r in kernels["rows"]:
        if r["method"] == "d2d copy":
            rows.append([f"**d2d copy**", f"{r['n']:,}", fmt(r["ms"], ".3f"), fmt(r["GBps"], ".0f"), "100%",
                         "", "", "", "", ""])
            continue
        met = "-" if r.get("target_met") is None else ("met" if r["target_met"] else "missed")
        rows.append([r["method"], f"{r['n']:,}", fmt(r["enc_ms"], ".3f"), fmt(r["enc_GBps"], ".0f"),
                     f"{100 * r['enc_frac_copy']:.0f}%", fmt(r["dec_ms"], ".3f"), fmt(r["dec_GBps"], ".0f"),
                     f"{100 * r['dec_frac_copy']:.0f}%", str(r.get("wrong")),
                     "-" if r.get("target") is None else f"{r['target']:.0%} {met}"])
    return out + md_table(["method", "n", "enc ms", "enc GB/s", "enc % copy", "dec ms", "dec GB/s", "dec % copy",
                           "wrong", "target"], rows) + [""]


def gpu_section(results_dir: str) -> list[str]:
    gpu = os.path.join(results_dir, "gpu")
    summary = _load(os.path.join(gpu, "summary.json"))
    kernels = _load(os.path.join(gpu, "kernels_cuda.json"))
    out = ["## GPU: the plan's checks and the CUDA kernels (tests/gpu/run.sh)", ""]
    if summary is None:
        return out + [f"No {gpu}/summary.json yet: `{RUN_CMD}`, then tests/gpu/collect.py.", ""]
    out += _checks_lines(summary)
    out += ["### CUDA kernel throughput (benchmarks/kernels_cuda.py)", ""]
    if kernels is None:
        return out + [f"No {gpu}/kernels_cuda.json yet.", ""]
    return out + _kernel_lines(kernels)
