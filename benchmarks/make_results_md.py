# Writes docs/results.md from the benchmarks' JSON files (comm_bench.json, step_bench_*.json, mem_bench_*.json, train_bench_*.json): machine, date, versions, tables, plots, commands; and README's short Results (--readme).
"""    python benchmarks/make_results_md.py [--results_dir benchmarks/results] [--out docs/results.md]

Only numbers found in the JSON files are written; a benchmark whose JSON is missing gets a line
saying so and the command that produces it."""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside this file: fmt, projection
from fmt import fmt, fmt_bytes, md_table  # noqa: E402
import projection  # noqa: E402
import results_gpu  # noqa: E402
import results_mem  # noqa: E402
import results_step  # noqa: E402

COMM_CMD = "sudo python benchmarks/comm_bench.py --world 2 3 4 --sizes 16M 64M --links 1 10 unshaped"
TRAIN_CMD = {"cpu": "sudo python benchmarks/train_bench.py --setting cpu --seeds 0 1 2",
             "gpu": "python benchmarks/train_bench.py --setting gpu"}


def comm_section(data: dict, rel: str, brief: bool = False) -> list[str]:
    """brief: the largest size per link only, no projections (README); docs/results.md has all."""
    m = data["meta"]
    out = ["## Reduce-scatter: bytes and time per call (benchmarks/comm_bench.py)", "",
           f"Measured {m['date']} on `{m['machine']}` ({m['cpu']}, {m['cores']} cores), torch {m['torch']}, "
           f"fsdpcomp {m['fsdpcomp']}. Ranks are processes on one machine joined by gloo; shaped links are "
           "network namespaces on a bridge with tc tbf on every rank's veth pair. Times are per call, the slowest "
           "rank's, median and p90; every result was checked against the exact fp64 mean first "
           f"({data['wrong']} wrong).", "", f"- {m['gloo_rs_note']}",
           "- `torch_bf16_hook` runs the steps of torch's FSDP `bf16_compress_hook` (cast, reduce_scatter_hook, "
           "cast back) minus its CUDA-only `record_stream`, which fails on CPU tensors.",
           "- `of ideal`: the speedup over fsdpcomp `none` divided by the ideal one, bytes_raw / bytes_sent.",
           "- `CPU bound`: the most of the ideal this machine allows even with the codec perfectly hidden behind "
           "the wire: the ideal time (`none` / ratio) against the rank's own encode + decode time (wall time: "
           "with ranks sharing cores it includes waiting for one). An estimate, from the mean codec time of the "
           "timed calls against their median, so as noisy as they are; well below the target, no exchange "
           "schedule can meet it here, only faster codecs (or a core per rank) can.", ""]
    if not m["namespaces"]:
        out += [f"**Namespaces could not be made ({m['namespaces_note']}): only unshaped runs were measured; "
                "the shaped links below are projected.**", ""]
    runs = data["runs"]
    if brief:  # README: the link the targets are set on; docs/results.md has every link
        slow = [r for r in runs if r["link"].startswith("1 Gbit")]
        if slow and len(slow) < len(runs):
            runs = slow
            out += ["Below: the 1 Gbit/s link, the largest size. Every link (10 Gbit/s, loopback), size and the "
                    "projections are in [docs/results.md](docs/results.md).", ""]
    cores = m.get("cores") or 0
    for run in runs:
        out += [f"### {run['link']}, W={run['world']} (point-to-point check {run['link_check_gbit']:.2f} Gbit/s)", ""]
        if cores and run["world"] > cores:
            # the codec time of ranks sharing a core adds up: a rank waits for peers it competes with
            out += [f"{run['world']} ranks share {cores} cores here: a rank's call includes waiting for peers "
                    "whose encode runs on its core, so codec-heavy methods fall further from their ideal than "
                    "on one core per rank.", ""]
        for size in (run["sizes"][-1:] if brief else run["sizes"]):
            out.append(f"{size['numel']} fp32 elements, {size['reps']} timed calls:")
            out.append("")
            rows = []
            for r in size["rows"]:
                codec = None if r["compress_s"] is None else (r["compress_s"] + r["decompress_s"]) * 1e3
                rows.append([r["method"], fmt_bytes(r["bytes_sent"]), fmt_bytes(r["wire_tx_bytes"]), f"{r['ratio']:.2f}",
                             f"{r['median_s'] * 1e3:.2f}", f"{r['p90_s'] * 1e3:.2f}", fmt(codec, ".2f"),
                             fmt(r["speedup_vs_torch_reduce_scatter"], ".2f"), fmt(r["speedup_vs_none"], ".2f"),
                             fmt(r["speedup_vs_torch_bf16_hook"], ".2f"), fmt(r["fraction_of_ideal"], ".0%"),
                             fmt(r.get("cpu_bound"), ".0%"), f"{r['rel_err']:.1e}"])
            out += md_table(["method", "payload/rank", "wire/rank", "ratio", "median ms", "p90 ms", "codec ms",
                              "vs torch rs", "vs none", "vs bf16 hook", "of ideal", "CPU bound", "rel err"], rows)
            out.append("")
    for proj in ([] if brief else data.get("projected", [])):
        out += [f"### PROJECTED (alpha-beta, not measured): {proj['gbit']:g} Gbit/s, W={proj['world']}, "
                f"alpha {proj['alpha_us']:g} us", ""]
        rows = [[str(s["numel"]), r["method"], f"{r['ratio']:.2f}", f"{r['time_s'] * 1e3:.2f}",
                 f"{r['speedup_vs_none']:.2f}", fmt(r["fraction_of_ideal"], ".0%")]
                for s in proj["sizes"] for r in s["rows"]]
        out += md_table(["elements", "method", "ratio", "projected ms", "vs none", "of ideal"], rows) + [""]
    out += ["### Targets (1 Gbit/s, >= 16M elements)", ""]
    if data["targets"]:
        out += [f"- {'MET' if t['met'] else 'MISSED'}: {t['target']} ({t['how']}, W={t['world']}, "
                f"{t['numel']} elements): {fmt(t['value'], '.3f')}"
                + ("" if t.get("codec_share") is None else f", encode+decode {t['codec_share']:.0%} of the call")
                + ("" if t.get("cpu_bound") is None else f", CPU bound here {t['cpu_bound']:.0%}")
                for t in data["targets"]]
    else:
        out.append("- no 1 Gbit/s run at 16M elements or more in this file")
    if brief:
        out += ["", "Smaller sizes, and projections for other links and for GPU clusters: "
                "[docs/results.md](docs/results.md)."]
    else:
        c = data["cluster"]
        rows_c, caption, kernels = cluster_with_gpu_times(
            c, os.path.join(os.path.dirname(data["_path"]), "gpu", "kernels_cuda.json"))
        out += ["", f"### PROJECTED for GPU clusters (alpha-beta, not measured): {c['numel']} fp32 elements "
                f"per GPU, alpha {c['alpha_us']:g} us", "", caption, ""]
        rows = [[f"{r['gbit']:.0f}", str(r["world"]), r["method"], f"{r['ratio']:.2f}", f"{r['time_s'] * 1e3:.2f}",
                 f"{r['speedup_vs_nccl_rs']:.2f}", f"{r['speedup_vs_none']:.2f}"] for r in rows_c]
        out += md_table(["Gbit/s", "GPUs", "method", "ratio", "projected ms", "vs NCCL rs", "vs none"], rows)
        # the step projection follows from the rows above and projection.py's stated assumptions
        compute_s = projection.compute_time(c["numel"])
        # the int8 parameter codec is the int8 gradient codec (block 256): the same measured ratio
        int8 = next((r for r in c["rows"] if r["method"] == "int8"), None)
        gather_kernel = kernels.get("int8") if kernels else None
        steps = projection.step_table(rows_c, c["numel"], c["alpha_us"] * 1e-6, compute_s,
                                      int8["ratio"] if int8 else None, gather_kernel)
        out += ["", "### PROJECTED step speedup for GPU clusters (not measured)", "",
                f"{projection.step_caption(c['numel'], compute_s)}. Uncompressed all-gathers bound what "
                "compressing the reduce-scatter alone can give; `+ gathers` compresses them too "
                f"(int8, ratio {fmt(int8 and int8['ratio'], '.2f')}"
                + (", codec from the same GPU kernel times" if gather_kernel else ", codec time 0: an upper bound")
                + "), against the same uncompressed baseline.", ""]
        rows = [[f"{r['gbit']:.0f}", str(r["world"]), r["method"], f"{r['ratio']:.2f}", f"{r['step_s'] * 1e3:.2f}",
                 f"{r['speedup_no_overlap']:.2f}", f"{r['speedup_full_overlap']:.2f}",
                 fmt(r.get("speedup_no_overlap_gathers"), ".2f"), fmt(r.get("speedup_full_overlap_gathers"), ".2f")]
                for r in steps]
        out += md_table(["Gbit/s", "GPUs", "method", "ratio", "step ms", "speedup, no overlap",
                          "speedup, overlap", "+ gathers, no overlap", "+ gathers, overlap"], rows)
    if os.path.exists(os.path.join(os.path.dirname(data["_path"]), "comm_bench.png")):
        out += ["", f"![reduce-scatter time per call]({rel}/comm_bench.png)"]
    shaped = m["namespaces"] and any(r["shaped"] for r in data["runs"])
    out += ["", "Reproduce:", "", "```", reproduce_cmd(m, COMM_CMD, root=shaped), "```", ""]
    return out


def cluster_with_gpu_times(c: dict, kernels_path: str) -> tuple[list[dict], str, dict | None]:
    """comm_bench.json's cluster projection with the GPU codec times of the newest run of the kernel
    table at kernels_path (the results folder's gpu/kernels_cuda.json): its rows (only the methods that run timed), the caption (which
    run fed it, which methods were left out), and the kernel times (None: there are none, and the
    rows are comm_bench's own with codec time 0, said so)."""
    try:
        kernels, info = projection.load_gpu_kernels(kernels_path)
    except (OSError, ValueError) as e:
        return c["rows"], f"{e}. Codec time is taken as 0, so these speedups are upper bounds.", None
    rows, left_out = projection.from_comm(c, kernels, info)
    where = projection.describe(info)
    caption = (f"Ratios measured by comm_bench (above); encode and decode times per element measured on a GPU: "
               f"{where} (benchmarks/kernels_cuda.py, each method at its defaults, at the largest size that run "
               "timed). Encode covers the W-1 chunks sent, decode the W-1 received; `vs none` compares with "
               "`none`'s wire time alone.")
    if left_out:
        caption += (f" Not projected, for want of a GPU row in that run (a codec time of 0 would claim a speedup "
                    f"nothing measured): {', '.join(left_out)}.")
    return rows, caption, kernels


def train_section(data: dict, rel: str) -> list[str]:
    m = data["meta"]
    which = m.get("stem", f"train_bench_{m['setting']}")
    out = [f"## Training: quality and time to quality, {m['setting']} setting (benchmarks/train_bench.py, `{which}`)", "",
           f"Measured {m['date']} on `{m['machine']}` ({m['cores']} cores), torch {m['torch']}, fsdpcomp "
           f"{m['fsdpcomp']}: {m['title']}.", ""]
    rows = []
    for r in data["rows"]:
        def pm(k, spec):
            v, s = r.get(k), r.get(k + "_std")
            return "-" if v is None else format(v, spec) + (f" ± {format(s, spec)}" if s else "")
        rows.append([r["method"], fmt(r["ratio"], ".2f"), pm("val_ppl", ".3f"), pm("delta_ppl_pct", "+.2f"),
                     pm("tokens_per_s", ".0f"), pm("step_ms_p50", ".1f"), fmt(r["comm_share"], ".0%"),
                     pm("time_to_baseline_ppl_s", ".1f") + ("" if r["reached_baseline_ppl"] == r["runs"]
                                                             else f" ({r['reached_baseline_ppl']}/{r['runs']})")])
    out += md_table(["method", "ratio", "val_ppl", "Δppl vs none %", "tokens/s", "step p50 ms", "comm share",
                      "time to baseline ppl s"], rows)
    out += ["", "Targets:", ""]
    for t in data["targets"]:
        if t["met"] is None:
            out.append(f"- n/a: {t['target']}: {t['note']}")
        else:
            out.append(f"- {'MET' if t['met'] else 'MISSED'}: {t['target']}: {t['method']} {t['delta_ppl_pct']:+.2f}%"
                       + (f", misses by {t['miss_by_pct']:.2f} points" if not t["met"] else ""))
    png = m.get("stem", f"train_bench_{m['setting']}") + ".png"
    if os.path.exists(os.path.join(os.path.dirname(data["_path"]), png)):
        out += ["", f"![loss curves and ratio vs quality]({rel}/{png})"]
    shaped = "(tc tbf)" in m["link"]
    out += ["", "Reproduce:", "", "```", reproduce_cmd(m, TRAIN_CMD.get(m["setting"], "python benchmarks/train_bench.py"),
                                                      root=shaped), "```", ""]
    return out


def reproduce_cmd(meta: dict, default: str, root: bool = False) -> str:
    """The run's own command line (its methods, sizes, seeds, links, tag), else `default`; with
    `sudo` when it measured shaped links (network namespaces need root: without, the benchmarks
    run unshaped or stop, so the same numbers would not come out)."""
    argv = meta.get("argv")
    if not argv:
        return default
    # --out_dir, --train_repo and --work_dir name scratch folders of the machine that ran it: leave them out
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--out_dir", "--train_repo", "--work_dir"):
            skip = True
        else:
            keep.append(shlex.quote(a))
    return ("sudo " if root else "") + "python " + " ".join(keep)


README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def sections(results_dir: str, rel: str, brief: bool = False) -> list[str]:
    """The generated sections, with plot links relative to `rel` (where the page lives)."""
    load = _load
    lines = []
    comm = os.path.join(results_dir, "comm_bench.json")
    if os.path.exists(comm):
        lines += comm_section(load(comm), rel, brief)
    else:
        lines += ["## Reduce-scatter", "", f"No {comm} yet: run `{COMM_CMD}`.", ""]
    for path in sorted(glob.glob(os.path.join(results_dir, "step_bench_*.json"))):
        data = load(path)
        shaped = any(r["link"] != "unshaped (loopback)" for r in data["timing"])
        lines += results_step.step_section(data, rel, reproduce_cmd(data["meta"], results_step.STEP_CMD, root=shaped),
                                           brief)
    if not brief:  # the memory per rank: docs/results.md only
        for path in sorted(glob.glob(os.path.join(results_dir, "mem_bench_*.json"))):
            data = load(path)
            lines += results_mem.mem_section(data, reproduce_cmd(data["meta"], results_mem.MEM_CMD))
        fc_mem = os.path.join(results_dir, "memory_per_rank.json")
        if os.path.exists(fc_mem):
            fc_data = load(fc_mem)
            lines += results_mem.fsdpcomp_section(
                fc_data, reproduce_cmd(fc_data["meta"], results_mem.FSDPCOMP_MEM_CMD))
        else:
            lines += ["## fsdpcomp's own memory per rank", "",
                      f"No {fc_mem} yet: run `{results_mem.FSDPCOMP_MEM_CMD}`.", ""]
    trains = sorted(glob.glob(os.path.join(results_dir, "train_bench_*.json")))
    for path in trains:
        lines += train_section(load(path), rel)
    if not trains:
        lines += ["## Training", "", f"No train_bench JSON yet: run `{TRAIN_CMD['cpu']}` "
                  f"(and `{TRAIN_CMD['gpu']}` on a GPU machine).", ""]
    if not brief:
        lines += results_gpu.gpu_section(results_dir)
    return lines


def _load(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    data["_path"] = path
    return data


def headline(results_dir: str, rel: str, doc_link: str) -> list[str]:
    """README's short Results: one headline table (the reduce-scatter on the link the targets
    are set on, the largest size, 2 ranks), the plot, and every target met or missed in one line
    each; the rest is in docs/results.md (doc_link)."""
    out = []
    comm_path = os.path.join(results_dir, "comm_bench.json")
    comm = _load(comm_path) if os.path.exists(comm_path) else None
    if comm is None:
        out += [f"No {comm_path} yet: run `{COMM_CMD}`.", ""]
    else:
        m = comm["meta"]
        runs = [r for r in comm["runs"] if r["link"].startswith("1 Gbit")] or comm["runs"]
        run = min(runs, key=lambda r: r["world"])
        size = run["sizes"][-1]
        out += [f"The reduce-scatter at {run['link'].split(' (')[0]}, {run['world']} ranks, {size['numel']} fp32 "
                f"elements (benchmarks/comm_bench.py, {m['date'][:10]}, {m['cpu']}, {m['cores']} cores; median of "
                f"{size['reps']} calls, checked against the exact mean first):", ""]
        rows = [[r["method"], f"{r['ratio']:.2f}", f"{r['median_s'] * 1e3:.0f}",
                 fmt(r["speedup_vs_torch_reduce_scatter"], ".2f"), fmt(r["speedup_vs_none"], ".2f"),
                 fmt(r["fraction_of_ideal"], ".0%")] for r in size["rows"]]
        out += md_table(["method", "ratio", "ms", "vs torch rs", "vs none", "of ideal"], rows) + [""]
        if os.path.exists(os.path.join(results_dir, "comm_bench.png")):
            out += [f"![reduce-scatter time per call]({rel}/comm_bench.png)", ""]
    out += ["Targets (the reduce-scatter at 1 Gbit/s, 2-4 ranks, 16M and 64M elements; training: the tiny "
            "model on 2 CPU ranks):", ""]
    if comm is not None:
        out += _comm_target_lines(comm["targets"])
    out += _train_target_lines([_load(p) for p in sorted(glob.glob(os.path.join(results_dir, "train_bench_*.json")))])
    out += ["", f"Every link, size, world size and training run, the projections for GPU clusters and the "
            f"commands that reproduce them: [{doc_link}]({doc_link}).", ""]
    return out


def _comm_target_lines(targets: list[dict]) -> list[str]:
    """One line per kind of target: how many of its cases were met, per method."""
    kinds: dict[str, dict[str, list[dict]]] = {}
    for t in targets:
        method, _, what = t["target"].partition(" ")
        kinds.setdefault(what, {}).setdefault(method, []).append(t)
    out = []
    for what, by_method in kinds.items():
        cells = []
        for method, ts in by_method.items():
            met = sum(1 for t in ts if t["met"])
            vals = [t["value"] for t in ts if t.get("value") is not None]
            span = f" ({min(vals):.2f}-{max(vals):.2f})" if vals and len(by_method) == 1 else ""
            cells.append(f"`{method}` {met}/{len(ts)}{span}")
        out.append(f"- {what}: met in " + ", ".join(cells))
    return out


MET_SEEDS = 3  # a training target counts as met only from a run of this many seeds or more


def _train_target_lines(trains: list[dict]) -> list[str]:
    """Per training target, what met it (or came closest), and in which run: the run with the
    most seeds first. A run of fewer than MET_SEEDS seeds (a tuning sweep) never meets one: a
    seed picked for its luck would."""
    found: dict[str, list[tuple[dict, dict]]] = {}
    for data in trains:
        for t in data["targets"]:
            if t["met"] is not None:
                found.setdefault(t["target"], []).append((t, data["meta"]))
    out = []
    for target, entries in found.items():
        entries.sort(key=lambda e: (-len(e[1].get("seeds") or [0]), e[0]["miss_by_pct"]))
        met = [e for e in entries if e[0]["met"] and len(e[1].get("seeds") or [0]) >= MET_SEEDS]
        shown = met if met else entries[:1]
        best_run = shown[0][1]
        cells = []
        for t, meta in shown:
            if meta is best_run:  # one run's numbers: the one with the most seeds
                cells.append(f"`{t['method']}` {t['delta_ppl_pct']:+.2f}%")
        where = (f"{best_run['stem']}: {len(best_run.get('seeds') or [0])} seed(s), "
                 f"{best_run['max_steps']} steps")
        if met:
            out.append(f"- MET: {target}: " + ", ".join(cells) + f" ({where})")
        else:
            out.append(f"- MISSED: {target}: closest " + ", ".join(cells)
                       + f", by {shown[0][0]['miss_by_pct']:.2f} points ({where})")
    return out


def update_readme(path: str, results_dir: str, doc_out: str) -> None:
    """Replaces README's Results section (between the markers) with the short headline."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{path} has no {README_BEGIN} ... {README_END} markers")
    here = os.path.dirname(os.path.abspath(path))
    rel = os.path.relpath(os.path.abspath(results_dir), here)
    doc_link = os.path.relpath(os.path.abspath(doc_out), here)
    body = headline(results_dir, rel, doc_link)
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    note = ("Generated by `python benchmarks/make_results_md.py --readme README.md` from "
            f"`{results_dir}`; do not edit by hand.")
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + README_BEGIN + "\n" + note + "\n\n" + "\n".join(body) + README_END + tail)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="docs/results.md (and README's Results) from the benchmarks' JSON")
    p.add_argument("--results_dir", default=os.path.join("benchmarks", "results"))
    p.add_argument("--out", default=os.path.join("docs", "results.md"))
    p.add_argument("--readme", default=None, help="also rewrite this README's Results section")
    args = p.parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    rel = os.path.relpath(os.path.abspath(args.results_dir), out_dir)
    lines = ["# Results", "",
             "Generated by `python benchmarks/make_results_md.py` from the JSON files in "
             f"`{args.results_dir}`; do not edit by hand. Projected numbers are labelled as such.", "",
             "The JSON files hold each run's summary (environment, command, rows, targets); per-step curves "
             "are not in git: each benchmark writes them gzip-compressed to `runs/curves/<file>.json.gz` "
             "(`--curves_dir`). Those of the runs below made before 2026-11-25 are in the history: "
             "`git show b48a927:benchmarks/results/<file>.json`.", ""]
    lines += sections(args.results_dir, rel)
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.out}")
    if args.readme:
        update_readme(args.readme, args.results_dir, args.out)
        print(f"updated the Results section of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
