"""Runs one group of GPU checks for tests/gpu/run.sh: each check function of the group's module
(`check_*`, in file order) in its own subprocess with a time limit, so a crash or a hang costs
that check only. Every result goes into one JSON summary as soon as its check ends (merged with
what earlier checks wrote: passed / failed / skipped, the reason, seconds, and the check's
details), so an outer timeout that kills the group loses only the check it was running. A group
has a budget (--budget, seconds): a check gets at most what is left of it, and checks it leaves no
time for are recorded as failed, not run.

    python tests/gpu/harness.py GROUP --out DIR [--budget S] [--only NAME ...] [--skip REASON]
    python tests/gpu/harness.py --one MODULE:CHECK --result FILE     (the subprocess side)
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)

GROUPS = {  # group -> (module, seconds each check may take)
    "bytes": ("checks_bytes", 420),
    "driver": ("checks_driver", 180),
    "train": ("checks_train", 420),
}


def checks_of(module_name: str) -> list[str]:
    mod = importlib.import_module(module_name)
    funcs = [(f.__code__.co_firstlineno, n) for n, f in vars(mod).items()
             if n.startswith("check_") and inspect.isfunction(f) and f.__module__ == mod.__name__]
    return [n for _, n in sorted(funcs)]


def run_one(spec: str, result_path: str) -> int:
    """The subprocess: runs MODULE:CHECK and writes {status, detail|reason|error} as JSON."""
    from gpu_common import Skip  # the class the checks raise (not a copy in __main__)
    module_name, name = spec.split(":")
    out = {"status": "failed"}
    try:
        detail = getattr(importlib.import_module(module_name), name)()
        out = {"status": "passed", "detail": detail}
    except Skip as e:
        out = {"status": "skipped", "reason": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure is a result to report
        out = {"status": "failed", "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()[-6000:]}
        detail = getattr(e, "detail", None)
        if detail is not None:
            out["detail"] = detail
    with open(result_path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return 0


def merge(summary_path: str, group: str, results: dict) -> dict:
    summary = {}
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    summary.setdefault("checks", {})
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for name, r in results.items():  # a later run of a check replaces its earlier result
        r.setdefault("at", now)
        summary["checks"][f"{group}.{name}"] = r
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for r in summary["checks"].values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary["counts"] = counts
    summary["updated"] = now
    tmp = summary_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    os.replace(tmp, summary_path)
    return summary


def run_group(group: str, out_dir: str, only: list[str], budget: float = 570.0, skip: str = "") -> int:
    module_name, per_check = GROUPS[group]
    names = [n for n in checks_of(module_name) if not only or n in only or n[6:] in only]
    failed, end = 0, time.time() + budget
    summary = os.path.join(out_dir, "summary.json")
    # FSDPCOMP_GPU_EXCLUDE=name,name: checks a profile leaves to another command, recorded so
    excluded = {e.strip() for e in os.environ.get("FSDPCOMP_GPU_EXCLUDE", "").split(",") if e.strip()}
    left = [n for n in names if n in excluded or n[6:] in excluded]
    if left:
        merge(summary, group, {n[6:]: {"status": "skipped", "seconds": 0.0,
                                       "reason": "excluded by FSDPCOMP_GPU_EXCLUDE"} for n in left})
        names = [n for n in names if n not in left]
    if skip:  # every check recorded as skipped, none run (run.sh --emulated: they need a GPU)
        merge(summary, group, {n[6:]: {"status": "skipped", "seconds": 0.0, "reason": skip} for n in names})
        print(f"[{group}] {len(names)} checks skipped: {skip}", flush=True)
        return 0
    for name in names:
        result_path = os.path.join(out_dir, f".{group}.{name}.json")
        if os.path.exists(result_path):
            os.remove(result_path)
        limit = min(per_check, int(end - time.time()))
        if limit < 10:
            merge(summary, group, {name[6:]: {"status": "failed", "seconds": 0.0,
                                              "error": f"not run: the group's {budget:.0f} s budget was spent"}})
            failed += 1
            print(f"[{group}] {name}: NOT RUN (the group's budget was spent)", flush=True)
            continue
        t0 = time.time()
        print(f"[{group}] {name} ...", flush=True)
        try:
            p = subprocess.run([sys.executable, __file__, "--one", f"{module_name}:{name}", "--result", result_path],
                               timeout=limit, cwd=ROOT, stdout=sys.stdout, stderr=sys.stderr)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        r = {"status": "failed", "error": f"no result (exit {rc}: crashed, or past its {limit} s limit)"}
        if os.path.exists(result_path):
            with open(result_path) as f:
                r = json.load(f)
            os.remove(result_path)
        r["seconds"] = round(time.time() - t0, 1)
        merge(summary, group, {name[6:]: r})  # now: a kill of the group later keeps it
        failed += r["status"] == "failed"
        why = r.get("error") or r.get("reason") or ""
        print(f"[{group}] {name}: {r['status'].upper()} ({r['seconds']} s) {why}", flush=True)
        if r["status"] == "failed" and r.get("traceback"):
            print(r["traceback"], flush=True)
    return 1 if failed else 0


def main() -> int:
    # the checkout's fsdpcomp where it is built in place, else the installed one (a bare source
    # tree has no _C and would shadow an install)
    built = any(f.startswith("_C") and f.endswith(".so") for f in os.listdir(os.path.join(ROOT, "fsdpcomp")))
    sys.path[:0] = [HERE, TESTS] + ([ROOT] if built else [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("group", nargs="?", choices=sorted(GROUPS))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "gpu"))
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--budget", type=float, default=570.0, help="seconds for the whole group")
    ap.add_argument("--skip", default="", help="record every check as skipped with this reason")
    ap.add_argument("--one")
    ap.add_argument("--result")
    ap.add_argument("--merge", nargs=3, metavar=("GROUP", "NAME", "RESULT_JSON"),
                    help="adds one result (run.sh's own steps: build, sanitizer, benchmark)")
    args = ap.parse_args()
    if args.one:
        return run_one(args.one, args.result)
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        group, name, result = args.merge
        merge(os.path.join(args.out, "summary.json"), group, {name: json.loads(result)})
        return 0
    return run_group(args.group, args.out, args.only, args.budget, args.skip)


if __name__ == "__main__":
    sys.exit(main())
