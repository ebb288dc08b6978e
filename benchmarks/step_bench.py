# End-to-end FSDP2 step benchmark: step time split into compute / all-gather / reduce-scatter, bytes per step, and val perplexity at equal steps, per configuration, with the Amdahl bound beside each speedup.
"""Trains the examples' GPT-2 (examples/fsdp_train.py's model, data, schedule and evaluation)
with FSDP2 on W CPU ranks, once per configuration:

    none        fsdpcomp `none`: fp32 reduce-scatter through fsdpcomp, torch's fp32 all-gather
    torch_bf16  plain FSDP2 with MixedPrecisionPolicy(reduce_dtype=bfloat16): torch's own bf16
                reduce-scatter (the FSDP2 form of torch's bf16 hook), fp32 all-gather
    int8        fsdpcomp int8 gradients, fp32 all-gather
    int8+int8   int8 gradients and int8 parameter all-gathers (param_gather "int8")

(or any fsdpcomp spec `method:JSON`, e.g. 'int8:{"param_gather": "fp8"}'). Two phases, each
run saved on its own as it finishes, so an interrupted benchmark resumes where it stopped:

- timing: a few steps per configuration over shaped links (network namespaces + tc tbf, as
  comm_bench; needs root), split into compute / all-gather / reduce-scatter by timing every
  collective call, with payload bytes per step (fsdpcomp's counters, or what torch's collective
  sends) and the bytes that left each rank's link (tx counter). Speedups are against `none` on
  the same link, beside the Amdahl bound: none's step with its all-gather and reduce-scatter
  times scaled by the configuration's bytes on the wire for each (compute unchanged), and the
  comm-free bound.
- quality: the same training, unshaped (the link changes no number), for more steps and
  several seeds, with val perplexity at the end; deltas are against `none` of the same seed.

    sudo python benchmarks/step_bench.py --model gpt2-62m --world 2 3 --links 1 0.1
    python benchmarks/step_bench.py --model tiny --phases quality --quality_seeds 0 1 2

The output JSON holds the phases and runs of the invocation that wrote it: run the whole
command again (finished runs are read back, not run) rather than one phase after the other.
The quality runs' per-step losses and evals go gzip-compressed to --curves_dir (not in git; see
benchmarks/results_io.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # the benchmark modules
import repo_path  # noqa: E402

repo_path.use_checkout()  # fsdpcomp built in place, else the installed one

import launch  # noqa: E402
from fmt import fmt, fmt_bytes  # noqa: E402
from netns import Topology, exit_on_sigterm  # noqa: E402
import results_io  # noqa: E402

CONFIGS = {
    "none": {"fsdpcomp": True, "method": "none", "config": {}},
    "torch_bf16": {"fsdpcomp": False, "reduce_dtype": "bf16"},
    "int8": {"fsdpcomp": True, "method": "int8", "config": {}},
    "int8+int8": {"fsdpcomp": True, "method": "int8", "config": {"param_gather": "int8"}},
}
DEFAULT_CONFIGS = list(CONFIGS)
# The targets: bytes per step, and val_ppl of int8 gathers (per model) against `none`.
BYTES_TARGET = ("int8+int8", 3.5)
PPL_TARGET = {"tiny": 0.5, "gpt2-62m": 1.0}


def parse_config(spec: str) -> dict:
    """A name from CONFIGS, or an fsdpcomp method with config keys: 'int8:{"param_gather": "fp8"}'."""
    if spec in CONFIGS:
        return dict(CONFIGS[spec])
    name, config = launch.method_spec(spec)
    import fsdpcomp
    fsdpcomp.CommState(name, config)  # an unknown method or key fails here, before any run
    return {"fsdpcomp": True, "method": name, "config": config}


def parse_link(text: str) -> float | None:
    if text == "unshaped":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"link must be a rate in Gbit/s, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"link rate must be positive, got {text!r}")
    return value


def link_label(gbit: float | None) -> str:
    if gbit is None:
        return "unshaped (loopback)"
    return f"{gbit * 1000:g} Mbit/s" if gbit < 1 else f"{gbit:g} Gbit/s"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def run_one(args, phase: str, spec: str, world: int, gbit: float | None, seed: int, steps: int) -> dict:
    """One training run, or its saved result when it already ran (resume)."""
    key = (f"{phase}-{args.model}-w{world}-{'unshaped' if gbit is None else _safe(link_label(gbit))}-"
           f"{_safe(spec)}-s{seed}-b{args.batch_size}x{args.max_length}-n{steps}")
    out = os.path.join(args.work_dir, key + ".json")
    if os.path.exists(out) and not args.force:
        print(f"== {key}: done before, read from {out}", flush=True)
        with open(out) as f:
            return json.load(f)
    cfg = dict(parse_config(spec), name=spec, model=args.model, batch_size=args.batch_size,
               max_length=args.max_length, steps=steps, seed=seed, eval=phase == "quality",
               eval_every=args.eval_every if phase == "quality" else 0, eval_batches=args.eval_batches,
               warmup=min(args.warmup, steps - 1) if phase == "timing" else 0, log_every=args.log_every,
               data_args=["--cache_dir", args.cache_dir] + (["--data_path", args.data_path] if args.data_path else [])
               + (["--val_path", args.val_path] if args.val_path else []), out=out)
    print(f"== {key}: {phase}, {spec}, W={world}, {link_label(gbit)}, {steps} steps", flush=True)
    topo = Topology(world, gbit) if gbit is not None else None
    if topo is not None:
        cfg.update(tx_path=topo.tx_bytes_path(), link_check_bytes=int(min(64e6, gbit * 1e9 / 8 * 0.2)))
    os.makedirs(args.work_dir, exist_ok=True)
    cfg_path = os.path.join(args.work_dir, key + ".config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    argv = [os.path.join(_HERE, "step_worker.py"), cfg_path]
    log_dir = os.path.join(args.work_dir, "logs", key)
    if topo is None:
        launch.run_ranks(argv, world, None, args.timeout_s, log_dir)
    else:
        with topo:
            launch.run_ranks(argv, world, topo, args.timeout_s, log_dir)
            cfg["dropped_packets"] = topo.dropped_packets()
    with open(out) as f:
        result = json.load(f)
    result["dropped_packets"] = cfg.get("dropped_packets")
    with open(out, "w") as f:
        json.dump(result, f)
    return result


# ---------------------------------------------------------------- timing rows


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def timing_row(spec: str, link: str, res: dict) -> dict:
    """Means over the timed steps (so compute + all-gather + reduce-scatter = step) of the mean
    over ranks, the median step beside them, and bytes per step and rank."""
    world, timed, ranks = res["world"], res["timed_steps"], res["ranks"]
    warm = res["config"]["warmup"]
    per_step = [{k: _mean([r["steps"][i][k] for r in ranks]) for k in ("step_s", "all_gather_s", "reduce_scatter_s", "codec_s")}
                for i in range(warm, warm + timed)]
    med = {k: statistics.fmean(s[k] for s in per_step) for k in per_step[0]}
    compute = med["step_s"] - med["all_gather_s"] - med["reduce_scatter_s"]  # everything else: fwd, bwd, optimizer

    def per_rank_step(get):
        vals = [get(r) for r in ranks]
        return None if any(v is None for v in vals) else statistics.fmean(vals) / timed

    def delta(key):  # fsdpcomp's counters over the timed steps
        return lambda r: None if r["counters"] is None else r["counters"][key] - r["snap"][1][key]

    def totals(key):  # what the collective would send uncompressed, in the dtype it was called with
        return lambda r: r["totals"][key] - r["snap"][0][key]

    fsdpcomp_run = res["config"]["fsdpcomp"]
    rs_bytes = per_rank_step(delta("bytes_sent") if fsdpcomp_run else totals("reduce_scatter_raw_bytes"))
    ag_bytes = per_rank_step(delta("param_gather_bytes_sent") if fsdpcomp_run else totals("all_gather_raw_bytes"))
    shaped = res["config"].get("tx_path") is not None
    return {"config": spec, "link": link, "world": world, "timed_steps": timed,
            "step_s": med["step_s"], "step_s_median": statistics.median(s["step_s"] for s in per_step),
            "step_s_all": [s["step_s"] for s in per_step],
            "compute_s": compute, "all_gather_s": med["all_gather_s"], "reduce_scatter_s": med["reduce_scatter_s"],
            "codec_s": med["codec_s"], "comm_share": (med["all_gather_s"] + med["reduce_scatter_s"]) / med["step_s"],
            "rs_bytes": rs_bytes, "ag_bytes": ag_bytes, "total_bytes": rs_bytes + ag_bytes,
            "wire_bytes": per_rank_step(lambda r: r["wire_tx_bytes"]),
            "rs_wire_bytes": per_rank_step(totals("reduce_scatter_wire_bytes")) if shaped else None,
            "ag_wire_bytes": per_rank_step(totals("all_gather_wire_bytes")) if shaped else None,
            "link_check_gbit": res.get("link_check_gbit"), "dropped_packets": res.get("dropped_packets"),
            "model_params": res["model_params"]}


def add_bounds(rows: list[dict]) -> None:
    """Speedup over `none` on the same link and world, and the Amdahl bounds, in place: none's
    step with each collective's time scaled by this configuration's bytes on the wire (shaped
    links: what left the link during its calls, so gloo's reduce-scatter counts with the
    all-reduce it runs underneath) or, unshaped, by its payload bytes."""
    for row in rows:
        base = next((r for r in rows if r["config"] == "none" and r["link"] == row["link"] and r["world"] == row["world"]), None)
        row.update(speedup=None, bound=None, bound_basis=None, comm_free_bound=None, of_bound=None, bytes_ratio=None)
        if base is None:
            continue
        row["speedup"] = base["step_s"] / row["step_s"]
        row["bytes_ratio"] = base["total_bytes"] / row["total_bytes"]
        wire = all(r.get(k) for r in (row, base) for k in ("ag_wire_bytes", "rs_wire_bytes"))
        ag, rs = ("ag_wire_bytes", "rs_wire_bytes") if wire else ("ag_bytes", "rs_bytes")
        ideal = (base["compute_s"] + base["all_gather_s"] * row[ag] / base[ag]
                 + base["reduce_scatter_s"] * row[rs] / base[rs])
        row["bound"] = base["step_s"] / ideal
        row["bound_basis"] = "wire" if wire else "payload"
        row["comm_free_bound"] = base["step_s"] / base["compute_s"]
        row["of_bound"] = row["speedup"] / row["bound"]


def timing_table(rows: list[dict], title: str) -> str:
    head = (f"{'config':<12}{'step ms':>9}{'compute':>9}{'all-gath':>9}{'red-scat':>9}{'codec':>8}{'comm':>6}"
            f"{'grad/step':>11}{'param/step':>11}{'wire/step':>11}{'bytes x':>8}{'speedup':>8}{'bound':>7}"
            f"{'of bnd':>7}{'no-comm':>8}")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['config']:<12}{r['step_s'] * 1e3:>9.0f}{r['compute_s'] * 1e3:>9.0f}{r['all_gather_s'] * 1e3:>9.0f}"
                     f"{r['reduce_scatter_s'] * 1e3:>9.0f}{r['codec_s'] * 1e3:>8.0f}{r['comm_share']:>6.0%}"
                     f"{fmt_bytes(r['rs_bytes']):>11}{fmt_bytes(r['ag_bytes']):>11}{fmt_bytes(r['wire_bytes']):>11}"
                     f"{fmt(r['bytes_ratio'], '.2f'):>8}{fmt(r['speedup'], '.2f'):>8}{fmt(r['bound'], '.2f'):>7}"
                     f"{fmt(r['of_bound'], '.0%'):>7}{fmt(r['comm_free_bound'], '.2f'):>8}")
    return "\n".join(lines)


# ---------------------------------------------------------------- quality rows


def quality_rows(runs: list[tuple[str, int, dict]]) -> list[dict]:
    """Per configuration: final val_ppl and train loss, mean ± std over seeds, and the change
    against `none` of the same seed."""
    base = {seed: res for spec, seed, res in runs if spec == "none"}
    rows = []
    for spec in dict.fromkeys(s for s, _, _ in runs):
        mine = [(seed, res) for s, seed, res in runs if s == spec]
        ppl = [res["evals"][-1]["val_ppl"] for _, res in mine if res["evals"]]
        deltas = [(res["evals"][-1]["val_ppl"] / base[seed]["evals"][-1]["val_ppl"] - 1) * 100
                  for seed, res in mine if seed in base and res["evals"] and base[seed]["evals"]]
        loss = [statistics.fmean(res["losses"][-10:]) for _, res in mine]
        sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else None)
        rows.append({"config": spec, "seeds": [seed for seed, _ in mine], "steps": len(mine[0][1]["losses"]),
                     "val_ppl": _mean(ppl), "val_ppl_std": sd(ppl), "delta_ppl_pct": _mean(deltas),
                     "delta_ppl_pct_std": sd(deltas), "deltas": deltas, "train_loss": _mean(loss)})
    return rows


def quality_table(rows: list[dict], title: str) -> str:
    head = f"{'config':<12}{'steps':>6}{'seeds':>10}{'val_ppl':>20}{'Δppl vs none %':>20}{'train loss':>12}"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        pm = (lambda v, s, spec: "-" if v is None else format(v, spec) + (f" ± {format(s, spec)}" if s else ""))
        lines.append(f"{r['config']:<12}{r['steps']:>6}{len(r['seeds']):>10}{pm(r['val_ppl'], r['val_ppl_std'], '.3f'):>20}"
                     f"{pm(r['delta_ppl_pct'], r['delta_ppl_pct_std'], '+.2f'):>20}{fmt(r['train_loss'], '.4f'):>12}")
    return "\n".join(lines)


def check_targets(model: str, timing: list[dict], quality: list[dict]) -> list[dict]:
    found = []
    name, want = BYTES_TARGET
    rows = [r for r in timing if r["config"] == name and r["bytes_ratio"] is not None]
    if rows:
        r = rows[0]
        found.append({"target": f"total FSDP bytes per step >= {want}x fewer with {name}", "value": r["bytes_ratio"],
                      "met": r["bytes_ratio"] >= want, "note": f"W={r['world']}"})
    for r in timing:
        if r["config"] == name and r["link"].startswith("1 Gbit") and r["of_bound"] is not None:
            found.append({"target": f"{name} step time at 1 Gbit/s, W={r['world']}, against its Amdahl bound",
                          "value": r["of_bound"], "met": None,
                          "note": f"speedup {r['speedup']:.2f}x of a {r['bound']:.2f}x bound; codec {r['codec_s'] * 1e3:.0f} ms "
                                  f"of a {r['step_s'] * 1e3:.0f} ms step"})
    limit = PPL_TARGET.get(model)
    for r in quality:
        if r["config"] == name and r["delta_ppl_pct"] is not None and limit is not None:
            found.append({"target": f"val ppl with {name} within {limit}% of none at equal steps ({model})",
                          "value": r["delta_ppl_pct"], "met": r["delta_ppl_pct"] <= limit,
                          "note": f"{len(r['seeds'])} seed(s), {r['steps']} steps"})
    return found


# ---------------------------------------------------------------- plot


def plot(timing: list[dict], quality_runs: list, path: str, title: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    groups = list(dict.fromkeys((r["world"], r["link"]) for r in timing))
    ncols = len(groups) + (1 if quality_runs else 0)
    if ncols == 0:
        return "no plot: nothing measured"
    fig, axes = plt.subplots(1, ncols, figsize=(4.6 * ncols, 4.4), squeeze=False)
    for ax, (world, link) in zip(axes[0], groups):
        rows = [r for r in timing if r["world"] == world and r["link"] == link]
        xs = range(len(rows))
        bottom = [0.0] * len(rows)
        for key, label in (("compute_s", "compute"), ("all_gather_s", "all-gather"), ("reduce_scatter_s", "reduce-scatter")):
            vals = [r[key] for r in rows]
            ax.bar(xs, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        base = next((r for r in rows if r["config"] == "none"), None)
        for i, r in enumerate(rows):
            if base is not None and r["bound"]:
                ax.plot([i - 0.4, i + 0.4], [base["step_s"] / r["bound"]] * 2, color="black", linewidth=1.5)
            if r["speedup"]:
                ax.annotate(f"{r['speedup']:.2f}x", (i, bottom[i]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [r["config"] for r in rows], rotation=20, fontsize=8)
        ax.set_ylabel("seconds per step (mean of the timed steps)")
        ax.set_title(f"W={world}, {link} (line: Amdahl bound)", fontsize=9)
        ax.legend(fontsize=7)
    if quality_runs:
        ax = axes[0][-1]
        first = quality_runs[0][1]
        for spec, seed, res in quality_runs:
            if seed != first:
                continue
            ax.plot(range(1, len(res["losses"]) + 1), res["losses"], label=spec, linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel(f"train loss (seed {first})")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    results_io.save_png(fig, path)
    plt.close(fig)
    return None


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-62m", help="examples/gpt.py preset (gpt2-62m, tiny)")
    p.add_argument("--world", type=int, nargs="+", default=[2], help="ranks, e.g. 2 3")
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                   help=f"names ({', '.join(CONFIGS)}) or fsdpcomp specs 'method:JSON'; `none` is always run")
    p.add_argument("--phases", nargs="+", choices=("timing", "quality"), default=["timing", "quality"])
    p.add_argument("--links", type=parse_link, nargs="+", default=[1.0, 0.1],
                   help="timing: shaped link rates in Gbit/s, or 'unshaped' (loopback: a quick check, no wire bytes)")
    p.add_argument("--warmup", type=int, default=2, help="timing: steps left out before the timed ones")
    p.add_argument("--timing_steps", type=int, default=5, help="timing: timed steps per configuration and link")
    p.add_argument("--quality_steps", type=int, default=200)
    p.add_argument("--quality_world", type=int, nargs="+", default=None,
                   help="ranks of the quality runs (default: the first --world; the link changes no number)")
    p.add_argument("--quality_seeds", type=int, nargs="+", default=[0])
    p.add_argument("--eval_every", type=int, default=50, help="quality: val ppl every N steps (and at the end)")
    p.add_argument("--eval_batches", type=int, default=8, help="validation batches per rank")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--data_path", default=None, help="default: the training example's built-in data")
    p.add_argument("--val_path", default=None)
    p.add_argument("--cache_dir", default=os.path.join(launch.REPO, "data", "cache"), help="tokenizer and token cache")
    p.add_argument("--work_dir", default=os.path.join(launch.REPO, "runs", "step_bench"),
                   help="one JSON per finished run: a re-run skips those (resume); --force runs them again")
    p.add_argument("--force", action="store_true")
    p.add_argument("--out_dir", default=os.path.join("benchmarks", "results"))
    p.add_argument("--curves_dir", default=results_io.CURVES_DIR,
                   help="the quality runs' losses and evals per step, as <stem>.json.gz (not in git)")
    p.add_argument("--tag", default="", help="suffix of the output files")
    p.add_argument("--log_every", type=int, default=10)
    p.add_argument("--timeout_s", type=float, default=6 * 3600.0, help="per run")
    args = p.parse_args(argv)
    exit_on_sigterm()
    try:
        configs = list(dict.fromkeys(["none"] + args.configs))  # every ratio is against it
        for spec in configs:
            parse_config(spec)
    except ValueError as e:
        p.error(str(e))
    if args.timing_steps < 1 or args.warmup < 0 or args.quality_steps < 1:
        p.error("--timing_steps and --quality_steps must be >= 1, --warmup >= 0")
    if "timing" in args.phases and any(g is not None for g in args.links):
        ok, why = Topology.available()
        if not ok:
            p.error(f"the timing phase shapes links with network namespaces, which cannot be made here: {why}")

    import torch
    import fsdpcomp
    quality_worlds = args.quality_world or args.world[:1]
    timing, quality_runs = [], []
    for world in dict.fromkeys(args.world + quality_worlds):
        if "timing" in args.phases and world in args.world:
            for gbit in args.links:
                for spec in configs:
                    res = run_one(args, "timing", spec, world, gbit, 0, args.warmup + args.timing_steps)
                    timing.append(timing_row(spec, link_label(gbit), res))
        if "quality" in args.phases and world in quality_worlds:
            for seed in args.quality_seeds:
                for spec in configs:
                    res = run_one(args, "quality", spec, world, None, seed, args.quality_steps)
                    quality_runs.append((spec, seed, res, world))
    add_bounds(timing)
    stem = f"step_bench_{_safe(args.model)}" + (f"_{args.tag}" if args.tag else "")
    print()
    for world in args.world:
        for link in dict.fromkeys(r["link"] for r in timing if r["world"] == world):
            rows = [r for r in timing if r["world"] == world and r["link"] == link]
            check = rows[0]["link_check_gbit"]
            print(timing_table(rows, f"timing: {args.model}, W={world}, {link} (point-to-point check "
                                     f"{fmt(check, '.2f')} Gbit/s), batch {args.batch_size}x{args.max_length}, "
                                     f"ms: mean of {rows[0]['timed_steps']} steps; bytes per step and rank"))
            print()
    quality = []
    for world in quality_worlds:
        runs = [(s, seed, res) for s, seed, res, w in quality_runs if w == world]
        if runs:
            rows = quality_rows(runs)
            for r in rows:
                r["world"] = world
            quality += rows
            print(quality_table(rows, f"quality: {args.model}, W={world}, unshaped, {args.quality_steps} steps, "
                                      f"batch {args.batch_size}x{args.max_length}, seeds {args.quality_seeds}"))
            print()
    targets = check_targets(args.model, timing, quality)
    print("Targets:")
    for t in targets:
        state = "measured" if t["met"] is None else ("MET" if t["met"] else "MISSED")
        print(f"  [{state}] {t['target']}: {t['value']:.3g} ({t['note']})")
    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, f"{stem}.png")
    title = (f"step_bench: {args.model}, FSDP2 on CPU ranks, batch {args.batch_size}x{args.max_length}")
    note = plot(timing, [(s, seed, res) for s, seed, res, _ in quality_runs], png, title)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
            "fsdpcomp": fsdpcomp.__version__, "argv": sys.argv if argv is None else argv, "model": args.model,
            "worlds": args.world, "batch_size": args.batch_size, "max_length": args.max_length,
            "configs": {c: parse_config(c) for c in configs}, "links": [link_label(g) for g in args.links],
            "warmup": args.warmup, "timing_steps": args.timing_steps, "quality_steps": args.quality_steps,
            "quality_seeds": args.quality_seeds, "plot": note, "title": title, "stem": stem,
            "model_params": (timing or [{}])[0].get("model_params") or
                            (quality_runs[0][2]["model_params"] if quality_runs else None)}
    result = {"meta": meta, "timing": timing, "quality": quality, "targets": targets}
    path = os.path.join(args.out_dir, f"{stem}.json")
    results_io.write_summary(path, result)
    print(f"\nwrote {path}" + (f", {png}" if note is None else f" ({note})"))
    if quality_runs:
        curves = results_io.write_curves(args.curves_dir, stem, [
            {"config": s, "seed": seed, "world": w, "losses": res["losses"], "evals": res["evals"]}
            for s, seed, res, w in quality_runs])
        print(f"curves: {curves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
