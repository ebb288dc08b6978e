# Every rank's memory, per parameter: FSDP2's parameters, gradients and AdamW state beside fsdpcomp's error-feedback residual and buffers, measured on CPU ranks and computed for any world size.
"""Measured: examples/gpt.py's GPT-2 under FSDP2 (fully_shard) on W gloo CPU ranks with an
error-feedback method, per residual dtype, a few steps each (mem_worker.py). Each rank sums the
bytes of the tensors it holds (mem_count.py); fsdpcomp's own counters (residual_bytes,
buffer_bytes) must equal what it found, and the resident set's growth once fsdpcomp runs is
reported beside them (what it shows beyond the counted tensors is the C codec's scratch).

Computed (mem_model.py): the same parts for W = 2 ... 1024, for this model and a 7B one
(LLaMA-2-7B's shapes), next to plain FSDP2's 16/W bytes per parameter. Every measured row is
checked against the computed one for its W, part by part, within --tolerance (10%).

    python benchmarks/mem_bench.py --model gpt2-62m --world 2 4 \\
        --methods topk 'int8:{"error_feedback": true}' --residual_dtypes fp32 bf16 int8

A residual dtype the config refuses (int8 before fsdpcomp has it) is listed as skipped: run the
same command again once it is accepted. Finished runs are read back from --work_dir (--force
runs them again). Exit status 1 when a measured row misses its computed one."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "examples")]
import repo_path  # noqa: E402

repo_path.use_checkout()  # fsdpcomp built in place, else the installed one

import launch  # noqa: E402
import mem_model  # noqa: E402
import results_io  # noqa: E402
import results_mem  # noqa: E402

PARTS = ("params", "grads", "optimizer", "residual", "buffers")
WORLDS = [2 ** k for k in range(1, 11)]  # computed: 2 ... 1024
# glibc maps every block of 64 KiB or more on its own (and never raises the threshold), so a
# freed tensor leaves the resident set at once: the RSS between steps is what is held
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def refusal(name: str, config: dict) -> str | None:
    """Why fsdpcomp refuses this config here (None: it takes it), asked before any run."""
    import fsdpcomp
    try:
        fsdpcomp.CommState(name, config)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def payload_fn(name: str, config: dict):
    """The method's payload bytes for a chunk of n elements (its C codec)."""
    import fsdpcomp
    return fsdpcomp.CommState(name, config)._core.payload_bytes  # the codec's own size rule


def _argv(argv: list[str] | None) -> list[str]:
    """The command line to reproduce the run with, the script named from the checkout's root."""
    if argv is not None:
        return ["benchmarks/mem_bench.py"] + argv
    return [os.path.relpath(os.path.abspath(sys.argv[0]), launch.REPO)] + sys.argv[1:]


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def run_one(args, spec: str, dtype: str, name: str, config: dict, world: int) -> dict:
    """One measured run, or its saved result (resume)."""
    key = f"{args.model}-w{world}-{_safe(spec)}-residual_{dtype}-n{args.steps}-s{args.seed}"
    out = os.path.join(args.work_dir, key + ".json")
    if os.path.exists(out) and not args.force:
        print(f"== {key}: done before, read from {out}", flush=True)
        with open(out) as f:
            return json.load(f)
    cfg = {"model": args.model, "method": name, "config": config, "steps": args.steps,
           "batch_size": args.batch_size, "max_length": args.max_length, "seed": args.seed, "out": out}
    os.makedirs(args.work_dir, exist_ok=True)
    cfg_path = os.path.join(args.work_dir, key + ".config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    print(f"== {key}: W={world}, {args.steps} fsdpcomp steps", flush=True)
    launch.run_ranks([os.path.join(_HERE, "mem_worker.py"), cfg_path], world, None, args.timeout_s,
                     os.path.join(args.work_dir, "logs", key), MALLOC_ENV)
    with open(out) as f:
        return json.load(f)


def measured_row(spec: str, dtype: str, res: dict, computed: dict, shard: int, tolerance: float) -> dict:
    """The largest value over the ranks of each part, per parameter, against the computed one;
    shard: the elements of the largest unit's shard, which the C codec's scratch is sized by."""
    n, ranks = res["model_params"], res["ranks"]
    got = {p: max(r[p] for r in ranks) for p in PARTS}
    want = {p: computed[p] for p in ("params", "grads", "optimizer", "buffers")}
    want["residual"] = computed["residual_" + dtype]
    ratio = {p: (got[p] / want[p]) if want[p] else (1.0 if got[p] == 0 else None) for p in PARTS}
    rss = max(r["rss_end"] - r["rss_plain"] for r in ranks)
    counted = max(r["residual"] + r["buffers"] for r in ranks)
    counters_ok = all(r["counters"]["residual_bytes"] == r["residual"] and r["counters"]["buffer_bytes"] == r["buffers"]
                      for r in ranks)
    return {"method": spec, "residual_dtype": dtype, "world": res["world"], "model_params": n,
            **{p: got[p] / n for p in PARTS}, **{p + "_computed": want[p] / n for p in PARTS},
            "ratio": ratio, "within": all(r is not None and abs(r - 1) <= tolerance for r in ratio.values()),
            "counters_equal_tensors": counters_ok,
            "buffer_peak": max(r["counters"]["buffer_peak_bytes"] for r in ranks) / n,
            "buffers_by_kind": ranks[0]["buffers_by_kind"], "rss_growth": rss / n, "counted": counted / n,
            "not_counted": (rss - counted) / n, "not_counted_per_shard_element": (rss - counted) / shard,
            "losses": res["losses"]}


def computed_rows(models: list[str], worlds: list[int], methods: dict) -> list[dict]:
    rows = []
    for model in models:
        units = mem_model.units_of(model)
        n = mem_model.n_params(units)
        for w in worlds:
            parts = mem_model.per_rank(units, w)
            row = {"model": model, "model_params": n, "world": w, "plain_fsdp2": mem_model.plain_fsdp2(n, w) / n,
                   **{k: v / n for k, v in parts.items()},
                   "buffers": {spec: mem_model.per_rank(units, w, fn)["buffers"] / n for spec, fn in methods.items()}}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-62m", help="examples/gpt.py preset measured (gpt2-62m, tiny)")
    p.add_argument("--world", type=int, nargs="+", default=[2, 4], help="ranks of the measured runs")
    p.add_argument("--methods", nargs="+", default=["topk", 'int8:{"error_feedback": true}'],
                   help="fsdpcomp methods with error feedback, 'method' or 'method:JSON'")
    p.add_argument("--residual_dtypes", nargs="+", default=["fp32", "bf16", "int8"])
    p.add_argument("--steps", type=int, default=3, help="fsdpcomp steps after the plain one")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--max_length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--computed_models", nargs="+", default=None, help="default: --model and llama-7b")
    p.add_argument("--tolerance", type=float, default=0.10, help="measured / computed, per part")
    p.add_argument("--work_dir", default=os.path.join(launch.REPO, "runs", "mem_bench"))
    p.add_argument("--force", action="store_true")
    p.add_argument("--out_dir", default=os.path.join("benchmarks", "results"))
    p.add_argument("--tag", default="", help="suffix of the output file")
    p.add_argument("--timeout_s", type=float, default=1800.0, help="per run")
    args = p.parse_args(argv)
    try:
        specs = {spec: launch.method_spec(spec) for spec in args.methods}
    except ValueError as e:
        p.error(str(e))
    import torch
    import fsdpcomp
    for spec, (name, config) in specs.items():
        why = refusal(name, config)
        if why:
            p.error(f"method {spec!r}: {why}")
    payloads = {spec: payload_fn(name, config) for spec, (name, config) in specs.items()}
    units = mem_model.units_of(args.model)
    measured, skipped = [], []
    for spec, (name, config) in specs.items():
        for dtype in args.residual_dtypes:
            cfg = dict(config, residual_dtype=dtype)
            why = refusal(name, cfg)
            if why:
                print(f"== {spec}, residual {dtype}: skipped, the config is refused: {why}", flush=True)
                skipped.append({"method": spec, "residual_dtype": dtype, "why": why})
                continue
            for world in args.world:
                res = run_one(args, spec, dtype, name, cfg, world)
                comp = mem_model.per_rank(units, world, payloads[spec])
                measured.append(measured_row(spec, dtype, res, comp, mem_model.largest_shard(units, world),
                                             args.tolerance))
    models = args.computed_models or list(dict.fromkeys([args.model, "llama-7b"]))
    computed = computed_rows(models, WORLDS, payloads)
    stem = f"mem_bench_{_safe(args.model)}" + (f"_{args.tag}" if args.tag else "")
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
            "fsdpcomp": fsdpcomp.__version__, "argv": _argv(argv), "model": args.model,
            "worlds": args.world, "steps": args.steps, "batch_size": args.batch_size, "max_length": args.max_length,
            "tolerance": args.tolerance, "stem": stem}
    result = {"meta": meta, "measured": measured, "skipped": skipped, "computed": computed}
    print("\n" + "\n".join(results_mem.measured_lines(result)))
    print("\n".join(results_mem.computed_lines(result)))
    path = os.path.join(args.out_dir, f"{stem}.json")
    results_io.write_summary(path, result)
    print(f"wrote {path}")
    missed = [r for r in measured if not r["within"] or not r["counters_equal_tensors"]]
    for r in missed:
        print(f"MISSED: {r['method']}, residual {r['residual_dtype']}, W={r['world']}: measured / computed "
              f"{r['ratio']}, counters equal the tensors: {r['counters_equal_tensors']}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
