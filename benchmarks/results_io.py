# How the benchmarks write what they measured: summaries into git (benchmarks/results), per-step curves gzip-compressed outside it, plots as small PNGs.
"""Three kinds of output, kept apart so that git holds only what docs/results.md is made from:

- the summary, `<out_dir>/<stem>.json` (benchmarks/results, committed): environment, command,
  rows, targets. Written with one row per line, so a re-run diffs row by row.
- the curves, `<curves_dir>/<stem>.json.gz` (default `runs/curves/` in the checkout, which git
  ignores): per-step losses and evals, and each training run's results.jsonl line. Nothing in
  docs/results.md is read from them; the benchmark that made them writes them again.
- the plot, `<out_dir>/<stem>.png`, as a 256-colour palette PNG (a third of the RGBA size,
  the same picture for line and bar plots)."""
from __future__ import annotations

import gzip
import io
import json
import os

import repo_path

CURVES_DIR = os.path.join(repo_path.REPO, "runs", "curves")
SUMMARY_DIGITS = 9  # significant digits of a summary's floats (rounded)


def _flat(x) -> bool:
    """A scalar, a list of scalars, or a dict whose values are scalars or lists of scalars: one line."""
    def scalar(v):
        return not isinstance(v, (dict, list))
    if isinstance(x, dict):
        return all(scalar(v) or (isinstance(v, list) and all(map(scalar, v))) for v in x.values())
    if isinstance(x, list):
        return all(map(scalar, x))
    return True


def dumps(obj, indent: int = 0) -> str:
    """JSON with nested containers indented one space a level and every flat one (a row) on one line."""
    if _flat(obj):
        return json.dumps(obj)
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    items = [inner + dumps(v, indent + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]" if items else "[]"


def rounded(x, digits: int = SUMMARY_DIGITS):
    """x with every float to `digits` significant digits: a measured time or ratio carries no
    more (these machines are noisy in the third), and 17-digit reprs took half the bytes of the
    results git keeps (its cap: tests/tools/test_readme.py)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


def write_summary(path: str, summary: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(rounded(summary)) + "\n")


def write_curves(curves_dir: str, stem: str, curves) -> str:
    """`curves` as gzip-compressed JSON in `<curves_dir>/<stem>.json.gz`; returns the path."""
    os.makedirs(curves_dir, exist_ok=True)
    path = os.path.join(curves_dir, f"{stem}.json.gz")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(curves, f)
    return path


def read_curves(path: str):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def save_png(fig, path: str, dpi: int = 110) -> None:
    """`fig` as a palette PNG; a plain RGBA one when Pillow is missing (matplotlib needs it anyway)."""
    try:
        from PIL import Image
    except ImportError:
        fig.savefig(path, dpi=dpi)
        return
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                   dither=Image.Dither.NONE).save(path, optimize=True)
