# The GPU section of docs/results.md: the GPU plan's checks, the one-GPU step cost and the CUDA kernel table, from benchmarks/results/gpu/.
"""Used by make_results_md.py; only numbers found in the JSON are written. The files come from
tests/gpu/collect.py over what tests/gpu/run.sh wrote on a GPU machine (tests/gpu/README.md).

The kernel table holds rows of several runs (each row's "run"). Rows with the bytes columns
(`enc_min_bytes`, benchmarks/kernels_cuda.py since issue 37) are shown in the table of record:
each of encode and decode against the copy, bytes per element, the fixed cost, the targets. Older
rows (GB/s of the minimum bytes, one target for both sides) follow in their own table."""
from __future__ import annotations

import json
import os

from fmt import fmt, md_table

RUN_CMD = "bash tests/gpu/run.sh prepare (here), then bash tests/gpu/run.sh quick and rest on the GPU machine"
FIXED_N = 1 << 16  # benchmarks/kernels_cuda.py's fixed-cost size: its rows fold into a column
STEP_CHECK = "train.step_cost_gpt2_62m"


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _checks_lines(summary: dict) -> list[str]:
    out = [f"Device: {summary.get('device')}. Runs, in order:", ""]
    for r in summary["runs"]:
        commit = f", commit {r['commit']}" if r.get("commit") else ""
        out.append(f"- run {r['run']} ({r.get('updated')}, torch {r.get('torch')}, NCCL {r.get('nccl')}{commit}): "
                   f"{r.get('note') or '(no note)'}")
    counts = summary.get("counts", {})
    out += ["", "Checks, each as its latest run left it: " +
            ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "skipped")) + ".", ""]
    rows = []
    for name, r in sorted(summary["checks"].items()):
        why = (r.get("error") or r.get("reason") or "").replace("|", "/").replace("\n", " ")
        rows.append([f"`{name}`", r["status"], fmt(r.get("seconds"), ".1f"), str(r.get("run")), why[:140]])
    return out + md_table(["check", "status", "s", "run", "why"], rows) + [""]


def _step_lines(summary: dict) -> list[str]:
    """The train group's one-GPU step cost (tests/gpu/checks_train.py), when a run measured it."""
    r = summary["checks"].get(STEP_CHECK)
    out = ["### One-GPU step cost of the codecs (tests/gpu/checks_train.py)", ""]
    if r is None or r["status"] != "passed" or not isinstance(r.get("detail"), dict):
        why = "not run yet" if r is None else (r.get("error") or r.get("reason") or r["status"])
        return out + [f"No measurement: `{STEP_CHECK}` {why}.", ""]
    d = r["detail"]
    out += [f"{d['model']} ({d['params']:,} parameters), FSDP2 on one GPU, {d['batch']} x {d['seq']} tokens, "
            f"`{d['method']}` with `param_gather` `{d['param_gather']}` and `compress_own_chunk` (run {r.get('run')}). "
            f"{d['how']}", ""]
    rows = [["step (FSDP2 at world 1: torch calls no collective)", fmt(d["step_ms"], ".2f")],
            ["gradient encode (device time)", fmt(d["grad_encode_ms"], ".2f")],
            ["gradient decode (device time)", fmt(d["grad_decode_ms"], ".2f")],
            ["parameter encode, 2 gathers (device time)", fmt(d["param_encode_ms"], ".2f")],
            ["parameter decode, 2 gathers (device time)", fmt(d["param_decode_ms"], ".2f")],
            ["codec total", fmt(d["codec_ms"], ".2f")],
            ["codec / step", fmt(d.get("codec_share_of_step"), ".0%")]]
    return out + md_table(["per step, mean of the timed steps", "ms"], rows) + [""]


def _per_n(b, n) -> str:
    return "-" if b is None else f"{b / n:.2f}n"


def _target_cell(r: dict, fixed: dict | None) -> str:
    """Each target of the row (and its fixed-cost row's), met or missed."""
    cells = []
    for side in ("enc", "dec"):
        t = r.get(f"{side}_target")
        if t:
            want = {"copy": f">= {t['value']:.0%}", "ms": f"<= {t['value']:g} ms", "us": f"<= {t['value']:g} us"}[t["kind"]]
            cells.append(f"{side} {want} {'met' if r[f'{side}_met'] else '**missed**'}")
    if fixed is not None and fixed.get("status") == "passed":
        ts = [(s, fixed[f"{s}_target"]) for s in ("enc", "dec") if fixed.get(f"{s}_target")]
        if ts:
            ok = all(fixed[f"{s}_met"] for s, _ in ts)
            cells.append(f"fixed <= {ts[0][1]['value']:g} us {'met' if ok else '**missed**'}")
    return ", ".join(cells) or "-"


def _new_lines(kernels: dict, rows: list[dict]) -> list[str]:
    runs = {r["run"]: r for r in kernels.get("runs", [])}
    used = sorted({r.get("run") for r in rows}, key=lambda x: (x is None, x))

    def run_text(i):
        r = runs.get(i, {})
        commit = f"commit {r['commit']}" if r.get("commit") else "commit not recorded"
        return f"run {i} ({(r.get('updated') or 'date not recorded')[:10]}, {commit}, {r.get('device') or kernels.get('device')})"
    out = ["Rows of " + "; ".join(run_text(i) for i in used) + ". One rank's gradient (W = 1, own chunk "
           "compressed, fp32). `% copy`: the bytes the kernel must move (encode: read g, write the payload, with "
           "`+ef` also read and write the fp32 residual; decode: read the payload, write out) over its time, as a "
           "share of the device-to-device copy's bandwidth timed in the same run at the same size. Bytes per "
           "element: the minimum, and what the kernels move, with its source (`model`: the passes "
           "benchmarks/kernels_cuda.py states for the dense codecs, `stale` when the run's kernels are other "
           "sources than the model's; `-`: neither measured nor modelled). `fixed us`: the time of a call at "
           "2^16 elements, encode / decode. `+ef`: with error feedback; `+sampled`: every call sampled for the "
           "error statistics. Targets (issue 37) are reported, not enforced; every row was checked against the "
           "CPU first, and a row that differs is FAILED, not timed.", ""]
    copies = [r for r in rows if r["method"] == "d2d copy"]
    if copies:
        out += ["Device-to-device copy: " + ", ".join(f"{r['n']:,} elements {r['GBps']:.0f} GB/s" for r in copies)
                + ".", ""]
    body = [r for r in rows if r["method"] != "d2d copy"]
    fixed = {r["method"]: r for r in body if r["n"] == FIXED_N}
    big = {r["method"] for r in body if r["n"] != FIXED_N}
    table = []
    for r in body:
        if r["n"] == FIXED_N and r["method"] in big:
            continue  # folded into its case's fixed-cost column
        f = fixed.get(r["method"]) if r["n"] != FIXED_N else None
        if r.get("status") == "failed":
            why = (r.get("error") or f"{r.get('wrong')} bytes/bits differ from the CPU").replace("|", "/")
            table.append([r["method"], f"{r['n']:,}", str(r.get("run")), f"FAILED: {why[:120]}"] + [""] * 7)
            continue
        src = r.get("moved_source")
        fixed_us = "-" if f is None or f.get("status") != "passed" else \
            f"{f['enc_ms'] * 1e3:.1f} / {f['dec_ms'] * 1e3:.1f}"
        if r["n"] == FIXED_N:
            fixed_us = f"{r['enc_ms'] * 1e3:.1f} / {r['dec_ms'] * 1e3:.1f}"
        table.append([r["method"], f"{r['n']:,}", str(r.get("run")), fmt(r["enc_ms"], ".3f"),
                      f"{100 * r['enc_frac_copy']:.0f}%", fmt(r["dec_ms"], ".3f"), f"{100 * r['dec_frac_copy']:.0f}%",
                      f"{_per_n(r['enc_min_bytes'], r['n'])} / {_per_n(r.get('enc_moved_bytes'), r['n'])}"
                      + (f" {src}" if src else ""),
                      f"{_per_n(r['dec_min_bytes'], r['n'])} / {_per_n(r.get('dec_moved_bytes'), r['n'])}"
                      + (f" {src}" if src else ""),
                      fixed_us, _target_cell(r, f)])
    return out + md_table(["case", "n", "run", "enc ms", "enc % copy", "dec ms", "dec % copy",
                           "enc bytes min / moved", "dec bytes min / moved", "fixed us", "targets"], table) + [""]


def _old_lines(kernels: dict, rows: list[dict]) -> list[str]:
    out = [f"Device {kernels.get('device')}, torch {kernels.get('torch')}; encode and decode-accumulate of "
           "one rank's gradient (W = 1, own chunk compressed, no error feedback), GB/s of the bytes each "
           "kernel must move, and that as a share of the device-to-device copy timed in the same run "
           "(copy: 2 x 4n bytes). Targets as these runs set them: quantisers >= 80% of copy, selection >= 25%, "
           "met only when encode and decode both meet it; reported, not enforced. Every row was checked against "
           "the CPU first (payload bytes, decoded bits): `wrong` counts the differences.", ""]
    table = []
    for r in rows:
        if r["method"] == "d2d copy":
            table.append(["**d2d copy**", f"{r['n']:,}", str(r.get("run")), fmt(r["ms"], ".3f"), fmt(r["GBps"], ".0f"),
                          "100%", "", "", "", "", ""])
            continue
        met = "-" if r.get("target_met") is None else ("met" if r["target_met"] else "missed")
        table.append([r["method"], f"{r['n']:,}", str(r.get("run")), fmt(r["enc_ms"], ".3f"), fmt(r["enc_GBps"], ".0f"),
                      f"{100 * r['enc_frac_copy']:.0f}%", fmt(r["dec_ms"], ".3f"), fmt(r["dec_GBps"], ".0f"),
                      f"{100 * r['dec_frac_copy']:.0f}%", str(r.get("wrong")),
                      "-" if r.get("target") is None else f"{r['target']:.0%} {met}"])
    return out + md_table(["method", "n", "run", "enc ms", "enc GB/s", "enc % copy", "dec ms", "dec GB/s",
                           "dec % copy", "wrong", "target"], table) + [""]


def _kernel_lines(kernels: dict) -> list[str]:
    rows = kernels["rows"]
    new_runs = {r.get("run") for r in rows if "enc_min_bytes" in r or r.get("status") == "failed"}
    new = [r for r in rows if r.get("run") in new_runs and (r["method"] == "d2d copy" or "status" in r)]
    old = [r for r in rows if r not in new]
    out = []
    if new:
        out += _new_lines(kernels, new)
    else:
        out += ["No run of the table of record yet (benchmarks/kernels_cuda.py since issue 37: encode and decode "
                "each judged, bytes moved, fixed cost, +ef and +sampled rows): `bash tests/gpu/run.sh quick` "
                "times it first.", ""]
    if old:
        out += ["#### Earlier runs (the table before issue 37)", ""] + _old_lines(kernels, old)
    return out


def gpu_section(results_dir: str) -> list[str]:
    gpu = os.path.join(results_dir, "gpu")
    summary = _load(os.path.join(gpu, "summary.json"))
    kernels = _load(os.path.join(gpu, "kernels_cuda.json"))
    out = ["## GPU: the plan's checks and the CUDA kernels (tests/gpu/run.sh)", ""]
    if summary is None:
        return out + [f"No {gpu}/summary.json yet: `{RUN_CMD}`, then tests/gpu/collect.py.", ""]
    out += _checks_lines(summary)
    out += _step_lines(summary)
    out += ["### CUDA kernel throughput (benchmarks/kernels_cuda.py)", ""]
    if kernels is None:
        return out + [f"No {gpu}/kernels_cuda.json yet.", ""]
    return out + _kernel_lines(kernels)
