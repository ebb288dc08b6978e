"""The GPU run's results, from the folders the device tool brought back, into the two files the
repository keeps: benchmarks/results/gpu/summary.json (every check's latest status and seconds,
which run gave it, the device) and benchmarks/results/gpu/kernels_cuda.json (the kernel table's
rows, each against the device-to-device copy of its own run). docs/results.md is then made from
them by benchmarks/make_results_md.py.

    python tests/gpu/collect.py DIR [DIR ...] [--note "what this run was"] [--out benchmarks/results/gpu]

DIRs in the order they ran: a check run again later replaces its earlier result; `--note` (once
per DIR, in order) says what each run was (what changed since the last). `--append` adds the DIRs
after the runs already collected in --out (an earlier session's, whose folders are gone). Both
files list the runs (date, device, torch, commit, note): the commit is the one prepare.py built
the carried libraries from (carried.json), else the first `main <hex>` of the run's note (the runs
of 2026-11-27/28, before prepare recorded it), else null. benchmarks/projection.py names the run
whose kernel rows it uses by these.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEEP_TRACEBACK = 2000  # characters of a failed check's traceback kept in the repository
KEEP_FAILURES, KEEP_FAILURE = 20, 400  # a pytest group's failures kept, and characters of each


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def commit_of(carried: dict, note: str) -> str | None:
    """The commit of a run: prepare's manifest (carried.json), else the note's `main <hex>`."""
    commit = ((carried.get("detail") or carried).get("manifest") or {}).get("commit") if carried else None
    if commit:
        return commit
    m = re.search(r"\bmain ([0-9a-f]{7,40})\b", note or "")
    return m.group(1) if m else None


def collect(dirs: list[str], notes: list[str], onto: tuple[dict, dict] | None = None) -> tuple[dict, dict]:
    """onto: the summary and kernel table of earlier runs (--append): these runs come after them."""
    summary = {"device": None, "runs": [], "checks": {}}
    kernels = {"device": None, "torch": None, "rows": {}}
    if onto is not None:
        summary = {"device": onto[0].get("device"), "runs": list(onto[0]["runs"]), "checks": dict(onto[0]["checks"])}
        kernels = {"device": onto[1].get("device"), "torch": onto[1].get("torch"),
                   "rows": {(r["method"], r["n"]): r for r in onto[1].get("rows", [])}}
    first = len(summary["runs"])
    for i, d in enumerate(dirs, first):
        s = _load(os.path.join(d, "summary.json"))
        env_path = os.path.join(d, "env.json")
        env = _load(env_path) if os.path.exists(env_path) else {}
        carried_path = os.path.join(d, "carried.json")
        carried = _load(carried_path) if os.path.exists(carried_path) else {}
        note = notes[i - first] if i - first < len(notes) else ""
        run = {"run": i, "dir": os.path.basename(os.path.abspath(d)), "updated": s.get("updated"),
               "device": env.get("device"), "torch": env.get("torch"), "nccl": env.get("nccl"),
               "emulated": env.get("emulated"), "commit": commit_of(carried, note), "note": note}
        summary["runs"].append(run)
        summary["device"] = env.get("device") or summary["device"]
        for name, r in s.get("checks", {}).items():
            earlier = summary["checks"].get(name)
            if r["status"] == "skipped" and earlier and earlier["status"] != "skipped":
                continue  # not run this time (a profile left it out): the result that ran stands
            r = dict(r, run=i)
            if "traceback" in r:
                r["traceback"] = r["traceback"][-KEEP_TRACEBACK:]
            if name.startswith("bench.") and "detail" in r:  # its rows go to kernels_cuda.json
                r["detail"] = "kernels_cuda.json"
            detail = r.get("detail")
            if isinstance(detail, dict) and "failures" in detail:  # pytest's: the first few, short
                detail["failures"] = [dict(f, error=f.get("error", "")[:KEEP_FAILURE])
                                      for f in detail["failures"][:KEEP_FAILURES]]
            summary["checks"][name] = r
        for path in sorted(glob.glob(os.path.join(d, "kernels*.json"))):
            k = _load(path)
            kernels["device"], kernels["torch"] = k.get("device"), k.get("torch")
            for row in k.get("rows", []):
                kernels["rows"][(row["method"], row["n"])] = dict(row, run=i)
    counts: dict[str, int] = {}
    for r in summary["checks"].values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary["counts"] = counts
    for r in summary["runs"]:  # runs collected before commits were recorded: from their notes
        if r.get("commit") is None:
            r["commit"] = commit_of({}, r.get("note", ""))
    rows = sorted(kernels["rows"].values(), key=lambda r: (r["n"], r["method"] != "d2d copy"))
    kernels["rows"] = rows
    kernels["runs"] = [{k: r.get(k) for k in ("run", "updated", "device", "torch", "commit", "note")}
                       for r in summary["runs"]]
    return summary, kernels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="folders holding summary.json (the device tool's files_at/gpu)")
    ap.add_argument("--note", action="append", default=[], help="what each run was, in the order of DIRs")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu"))
    ap.add_argument("--append", action="store_true",
                    help="add the DIRs as runs after those already in --out (whose folders are gone)")
    args = ap.parse_args(argv)
    missing = [d for d in args.dirs if not os.path.exists(os.path.join(d, "summary.json"))]
    if missing:
        ap.error(f"no summary.json in {', '.join(missing)}")
    onto = None
    if args.append:
        onto = (_load(os.path.join(args.out, "summary.json")), _load(os.path.join(args.out, "kernels_cuda.json")))
    summary, kernels = collect(args.dirs, args.note, onto)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    if kernels["rows"]:
        with open(os.path.join(args.out, "kernels_cuda.json"), "w") as f:
            json.dump(kernels, f, indent=1)
    print(f"{args.out}: {summary['counts']} on {summary['device']}; {len(kernels['rows'])} kernel rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
