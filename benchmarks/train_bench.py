# Quality and time to quality: examples/fsdp_train.py for `none` and every method with identical settings, as one table, JSON and plots.
"""Runs the training example once per method (and seed) with the same data, steps, seed and
model, reads back each run's results.jsonl line and its metrics.jsonl curve, and prints:
method, compression ratio, final val_ppl, its change vs `none`, tokens/s, step time p50, comm
share, and the training time each method needs to reach the baseline's final perplexity.
The summary (rows, targets, command) goes to --out_dir, each run's line and curve gzip-compressed
to --curves_dir (not in git; see benchmarks/results_io.py).

    sudo python benchmarks/train_bench.py --setting cpu            # 2 ranks, tiny, 1 Gbit/s link
    python benchmarks/train_bench.py --setting gpu                 # 1 GPU, gpt2-62m, compress_own_chunk
    sudo python benchmarks/train_bench.py --setting cpu --seeds 0 1 2   # mean ± std over seeds
    sudo python benchmarks/train_bench.py --methods int8 'intN:{"bits": 2}' --tag variants
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # the benchmark modules
import repo_path  # noqa: E402

repo_path.use_checkout()  # fsdpcomp built in place, else the installed one

import launch  # noqa: E402
import results_io  # noqa: E402
from netns import Topology, exit_on_sigterm  # noqa: E402

# What each setting means; every flag can still be overridden on the command line.
SETTINGS = {
    "cpu": {"world": 2, "model": "tiny", "link": 1.0, "max_steps": 200, "batch_size": 8, "max_length": 128,
            "eval_every": 25, "config": {}},
    "gpu": {"world": 1, "model": "gpt2-62m", "link": None, "max_steps": 1000, "batch_size": 16,
            "max_length": 256, "eval_every": 100, "config": {"compress_own_chunk": True}},
}

# The targets: (what, methods or a minimum ratio, allowed val_ppl change in %).
TARGETS = [("int8, fp8, bf16 within 0.5% of the baseline perplexity", ("int8", "fp8", "bf16"), None, 0.5),
           ("a method with >= 8x compression within 1%", None, 8.0, 1.0),
           ("a method with >= 32x compression within 3%", None, 32.0, 3.0)]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def read_jsonl(path: str) -> list[dict]:
    out = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n} is not JSON: {e}") from None
    return out


def time_to_ppl(curve: list[dict], target: float | None) -> float | None:
    """Training seconds at the first evaluation whose val_ppl reached `target`."""
    if target is None:
        return None
    for point in curve:
        if "val_ppl" in point and point["val_ppl"] <= target:
            return point["train_time_s"]
    return None


def run_training(args, spec: str, seed: int, topo: Topology | None, work: str) -> dict:
    method, own = launch.method_spec(spec)
    label = "".join(c if c.isalnum() else "_" for c in spec).strip("_")
    run_name = f"{args.setting}-{label}-s{seed}"
    out_dir = os.path.join(work, "runs")
    log_dir = os.path.join(out_dir, "logs", run_name)
    shutil.rmtree(log_dir, ignore_errors=True)  # metrics.jsonl is appended to: start it afresh
    config = dict(SETTINGS[args.setting]["config"])
    config.update(json.loads(args.comm_config_json) if args.comm_config_json else {})
    config.update(own)
    results = os.path.join(work, "results.jsonl")
    argv = [args.train_script, "--comm_compress", method, "--comm_config_json", json.dumps(config),
            "--model", args.model, "--max_steps", str(args.max_steps), "--batch_size", str(args.batch_size),
            "--max_length", str(args.max_length), "--seed", str(seed), "--eval_every", str(args.eval_every),
            "--output_dir", out_dir, "--run_name", run_name, "--results_file", results,
            "--cache_dir", os.path.join(work, "cache")]
    if args.data_path:
        argv += ["--data_path", args.data_path]
    argv += args.train_args
    env = {"PYTHONPATH": args.train_repo} if args.train_repo else None
    launch.run_ranks(argv, args.world, topo, args.timeout_s, os.path.join(work, "launch", run_name), env)
    records = [r for r in read_jsonl(results) if r.get("run_name") == run_name]
    if not records:
        raise RuntimeError(f"{run_name} finished but wrote no line to {results}")
    return {"method": spec, "seed": seed, "record": records[-1],
            "curve": read_jsonl(os.path.join(log_dir, "metrics.jsonl"))}


def summarise(runs: list[dict]) -> list[dict]:
    """One row per method: mean ± std over seeds, deltas against `none` of the same seed."""
    base = {r["seed"]: r for r in runs if r["method"] == "none"}
    rows = []
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        deltas, t_target = [], []
        for r in mine:
            b = base.get(r["seed"])
            if b is not None and b["record"].get("val_ppl") and r["record"].get("val_ppl") is not None:
                deltas.append((r["record"]["val_ppl"] / b["record"]["val_ppl"] - 1.0) * 100.0)
                t_target.append(time_to_ppl(r["curve"], b["record"]["val_ppl"]))
        row = {"method": method, "seeds": [r["seed"] for r in mine],
               "reached_baseline_ppl": sum(t is not None for t in t_target), "runs": len(mine)}
        for key, values in (("ratio", [r["record"].get("compression_ratio") for r in mine]),
                            ("val_ppl", [r["record"].get("val_ppl") for r in mine]),
                            ("delta_ppl_pct", deltas),
                            ("tokens_per_s", [r["record"].get("tokens_per_s") for r in mine]),
                            ("step_ms_p50", [r["record"].get("step_time_ms_p50") for r in mine]),
                            ("comm_share", [r["record"].get("comm_ratio") for r in mine]),
                            ("time_to_baseline_ppl_s", t_target)):
            row[key], row[key + "_std"] = mean_std(values)
        rows.append(row)
    return rows


def _pm(value, std, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec) + (f" ± {format(std, spec)}" if std else "")


def table(rows: list[dict], title: str) -> str:
    head = (f"{'method':<10}{'ratio':>8}{'val_ppl':>18}{'Δppl %':>16}{'tokens/s':>18}{'step p50 ms':>16}"
            f"{'comm share':>12}{'t to base ppl s':>18}")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        t = _pm(r["time_to_baseline_ppl_s"], r["time_to_baseline_ppl_s_std"], ".1f")
        if r["reached_baseline_ppl"] < r["runs"]:
            t = f"{t} ({r['reached_baseline_ppl']}/{r['runs']})"
        lines.append(f"{r['method']:<10}{_pm(r['ratio'], None, '.2f'):>8}"
                     f"{_pm(r['val_ppl'], r['val_ppl_std'], '.3f'):>18}"
                     f"{_pm(r['delta_ppl_pct'], r['delta_ppl_pct_std'], '+.2f'):>16}"
                     f"{_pm(r['tokens_per_s'], r['tokens_per_s_std'], '.0f'):>18}"
                     f"{_pm(r['step_ms_p50'], r['step_ms_p50_std'], '.1f'):>16}"
                     f"{_pm(r['comm_share'], None, '.0%'):>12}{t:>18}")
    return "\n".join(lines)


def check_targets(rows: list[dict]) -> list[dict]:
    found = []
    for what, names, min_ratio, limit in TARGETS:
        cands = [r for r in rows if r["method"] != "none" and r["delta_ppl_pct"] is not None and (
            (names and r["method"] in names) or (min_ratio and (r["ratio"] or 0) >= min_ratio))]
        if not cands:
            found.append({"target": what, "met": None, "note": "no such method ran"})
        elif names:
            for r in cands:
                found.append({"target": what, "method": r["method"], "delta_ppl_pct": r["delta_ppl_pct"],
                              "met": r["delta_ppl_pct"] <= limit,
                              "miss_by_pct": max(0.0, r["delta_ppl_pct"] - limit)})
        else:
            best = min(cands, key=lambda r: r["delta_ppl_pct"])
            found.append({"target": what, "method": best["method"], "delta_ppl_pct": best["delta_ppl_pct"],
                          "ratio": best["ratio"], "met": best["delta_ppl_pct"] <= limit,
                          "miss_by_pct": max(0.0, best["delta_ppl_pct"] - limit)})
    return found


def plot(runs: list[dict], rows: list[dict], path: str, title: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    first_seed = runs[0]["seed"]
    for r in runs:
        if r["seed"] != first_seed:
            continue
        pts = [p for p in r["curve"] if "loss" in p]
        ax1.plot([p["step"] for p in pts], [p["loss"] for p in pts], label=r["method"], linewidth=1)
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"train loss (seed {first_seed})")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    for r in rows:
        if r["ratio"] and r["delta_ppl_pct"] is not None:
            ax2.errorbar(r["ratio"], r["delta_ppl_pct"], yerr=r["delta_ppl_pct_std"] or 0, fmt="o")
            ax2.annotate(r["method"], (r["ratio"], r["delta_ppl_pct"]), fontsize=7)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("compression ratio (vs fp32)")
    ax2.set_ylabel("final val_ppl change vs none (%)")
    ax2.axhline(0, color="grey", linewidth=0.8)
    ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    results_io.save_png(fig, path)
    plt.close(fig)
    return None


def train_all(args, methods: list[str], link, link_note: str) -> list[dict]:
    """Every method for every seed (seeds outer), each run's record and curve."""
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for seed in args.seeds:
            for method in methods:
                print(f"== {args.setting}: {method}, seed {seed}, W={args.world}, {link_note}", flush=True)
                if link is None:
                    runs.append(run_training(args, method, seed, None, work))
                else:
                    with Topology(args.world, link) as topo:
                        runs.append(run_training(args, method, seed, topo, work))
    return runs


def baseline_runs(args) -> list[dict]:
    """--baseline: the `none` runs of earlier invocations (their curves files) for this one's seeds,
    instead of training them again; refused where those ran other settings or lack a seed."""
    runs = []
    for stem in args.baseline:
        with open(os.path.join(args.out_dir, f"{stem}.json"), encoding="utf-8") as f:
            meta = json.load(f)["meta"]
        for key in ("setting", "model", "world", "max_steps", "batch_size", "max_length"):
            if meta[key] != getattr(args, key):
                raise SystemExit(f"--baseline {stem} ran {key} = {meta[key]!r}, this run {getattr(args, key)!r}")
        runs += [r for r in results_io.read_curves(os.path.join(args.curves_dir, f"{stem}.json.gz"))
                 if r["method"] == "none" and r["seed"] in args.seeds]
    missing = sorted(set(args.seeds) - {r["seed"] for r in runs})
    if missing:
        raise SystemExit(f"--baseline {' '.join(args.baseline)} has no `none` run of seed(s) {missing}")
    by_seed = {r["seed"]: r for r in runs}  # one per seed, the last stem's where several have it
    return [by_seed[s] for s in args.seeds]


def merged_runs(args, argv) -> tuple[list[dict], list[str], list[int]]:
    """--merge: the runs of earlier invocations (their curves files), their seeds, and the first
    one's command line with every seed, which reproduces them in one invocation."""
    runs, metas = [], []
    for stem in args.merge:
        runs += results_io.read_curves(os.path.join(args.curves_dir, f"{stem}.json.gz"))
        with open(os.path.join(args.out_dir, f"{stem}.json"), encoding="utf-8") as f:
            metas.append(json.load(f)["meta"])
    seeds = sorted({r["seed"] for r in runs})
    first = list(metas[0]["argv"])
    i = first.index("--seeds") + 1 if "--seeds" in first else len(first)
    j = i
    while j < len(first) and not first[j].startswith("--"):
        j += 1
    first[i:j] = [str(x) for x in seeds]
    if "--tag" in first:  # the merged summary's own name
        first[first.index("--tag") + 1] = args.tag
    if "--curves_dir" in first:  # a scratch folder of the machine that ran it
        k = first.index("--curves_dir")
        del first[k:k + 2]
    for key in ("setting", "model", "world", "max_steps", "batch_size", "max_length"):
        setattr(args, key, metas[0][key])
    return runs, first, seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=list(SETTINGS), default="cpu")
    p.add_argument("--methods", nargs="+", default=None,
                   help='default: none + every fsdpcomp method; NAME:JSON adds config keys, e.g. \'intN:{"bits": 2}\'')
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="e.g. 0 1 2 for mean ± std")
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--link", default="setting", help="Gbit/s of the shaped link, 'unshaped', or 'setting'")
    p.add_argument("--max_steps", type=int, default=None)
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--max_length", type=int, default=None)
    p.add_argument("--eval_every", type=int, default=None)
    p.add_argument("--comm_config_json", default=None, help="config keys added to every method's (e.g. error_feedback)")
    p.add_argument("--data_path", default=None, help="default: the training example's built-in data")
    p.add_argument("--train_script", default=os.path.join(launch.REPO, "examples", "fsdp_train.py"))
    p.add_argument("--train_repo", default=None, help="checkout whose fsdpcomp the runs import (default: this one if built in place, else the installed package)")
    p.add_argument("--out_dir", default=os.path.join("benchmarks", "results"))
    p.add_argument("--curves_dir", default=results_io.CURVES_DIR,
                   help="each run's results.jsonl line and metrics.jsonl curve, as <stem>.json.gz (not in git)")
    p.add_argument("--tag", default="", help="suffix of the output files, for a second set of runs")
    p.add_argument("--timeout_s", type=float, default=3600.0, help="per training run")
    p.add_argument("--merge", nargs="+", default=None, metavar="STEM",
                   help="train nothing: summarise the runs of earlier invocations' curves (e.g. one per seed, "
                        "run one after another) as if they were one")
    p.add_argument("--baseline", nargs="+", default=None, metavar="STEM",
                   help="take `none`'s runs from earlier invocations' curves (same settings and seeds) "
                        "instead of training them again")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: passed to fsdp_train.py unchanged")
    args = p.parse_args(argv)
    exit_on_sigterm()
    if args.train_args and args.train_args[0] == "--":
        args.train_args = args.train_args[1:]
    preset = SETTINGS[args.setting]
    for key in ("world", "model", "max_steps", "batch_size", "max_length", "eval_every"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    link = preset["link"] if args.link == "setting" else (None if args.link == "unshaped" else float(args.link))
    if not os.path.exists(args.train_script):
        p.error(f"--train_script {args.train_script} does not exist")

    import torch
    import fsdpcomp
    methods = args.methods or (["none"] + [m for m in fsdpcomp.methods() if m != "none"])
    try:
        unknown = [m for m in methods if launch.method_spec(m)[0] not in fsdpcomp.methods()]
    except ValueError as e:
        p.error(str(e))
    if unknown:
        p.error(f"unknown method {unknown[0]!r}; fsdpcomp.methods() = {fsdpcomp.methods()}")
    if "none" not in methods:
        methods = ["none"] + methods  # every delta is against it
    link_note = "unshaped (loopback)" if link is None else f"{link:g} Gbit/s (tc tbf)"
    if link is not None and args.world > 1:
        ok, why = Topology.available()
        if not ok:
            print(f"NOTE: cannot make network namespaces ({why}); training runs UNSHAPED on loopback")
            link, link_note = None, f"unshaped (loopback): namespaces unavailable: {why}"
    elif args.world == 1:
        link, link_note = None, "one process: no link"

    os.makedirs(args.out_dir, exist_ok=True)
    if args.merge:
        runs, argv, args.seeds = merged_runs(args, argv)
    elif args.baseline:
        runs = baseline_runs(args)
        runs += train_all(args, [m for m in methods if m != "none"], link, link_note)
    else:
        runs = train_all(args, methods, link, link_note)
    rows = summarise(runs)
    title = (f"train_bench {args.setting}: {args.model}, W={args.world}, {link_note}, {args.max_steps} steps, "
             f"batch {args.batch_size}x{args.max_length}, seeds {args.seeds}")
    print()
    print(table(rows, title))
    targets = check_targets(rows)
    print("\nTargets:")
    for t in targets:
        state = "n/a" if t["met"] is None else ("MET" if t["met"] else "MISSED")
        extra = t.get("note") or f"{t['method']}: {t['delta_ppl_pct']:+.2f}%" + (
            f" (misses by {t['miss_by_pct']:.2f} points)" if t["met"] is False else "")
        print(f"  [{state}] {t['target']}: {extra}")
    stem = f"train_bench_{args.setting}" + (f"_{args.tag}" if args.tag else "")
    png = os.path.join(args.out_dir, f"{stem}.png")
    note = plot(runs, rows, png, title)
    result = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "fsdpcomp": fsdpcomp.__version__, "argv": sys.argv if argv is None else argv,
                       "setting": args.setting, "model": args.model, "world": args.world, "link": link_note,
                       "max_steps": args.max_steps, "batch_size": args.batch_size, "max_length": args.max_length,
                       "seeds": args.seeds, "plot": note, "title": title, "stem": stem},
              "rows": rows, "targets": targets}
    path = os.path.join(args.out_dir, f"{stem}.json")
    results_io.write_summary(path, result)
    curves = results_io.write_curves(args.curves_dir, stem, [
        {"method": r["method"], "seed": r["seed"], "record": r["record"], "curve": r["curve"]} for r in runs])
    print(f"\nwrote {path}" + (f", {png}" if note is None else f" ({note})") + f"; curves: {curves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
