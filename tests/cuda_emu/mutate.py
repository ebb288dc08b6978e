"""Proof that the emulated CUDA tests can fail: a few single-constant mutants of cuda/ (a scale, an
index offset, a rounding mode, a block geometry), each built into the emulated library from a
scratch copy of cuda/ (build.py's FSDPCOMP_EMU_CUDA_SRC) and run under the emulated test files.
A mutant the tests do not fail has survived: the script prints a table and exits 1.

    python3 tests/cuda_emu/mutate.py            # every mutant
    python3 tests/cuda_emu/mutate.py --quick    # the first three
    python3 tests/cuda_emu/mutate.py --only int8-round-floor --no-baseline

Measured on the 2-core CI-sized machine, shared (load ~6): the full run 965 s (the unmutated
baseline 414 s, each mutant 77-99 s: killed at its first failing test); --quick about 12 min,
--quick --no-baseline about 5. With the test files before the aliasing fix (acc.to("cpu") was
acc) sparse-decompress-alpha-x2 survived all 302 emulated tests; now test_cuda_single kills it.

The unmutated sources run first (a failing baseline kills every mutant and proves nothing: exit 2,
--no-baseline skips it). A mutant whose edit no longer applies (the line changed) is an error
(exit 2): update its line here, as the kernels change."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTS = os.path.join(ROOT, "tests")
# the emulated test files, the cheapest killers first; -x: a mutant dies at its first failing test
FILES = ["cuda/test_cuda_files_emulated.py", "cuda/test_cuda_emulated.py"]

# (name, file in cuda/, text, its replacement, what it breaks); `text` occurs exactly once
MUTANTS = [
    ("sparse-decompress-alpha-x2", "fc_cu_sparse_common.cu",
     "sp_add_one(dec, d, va, 0, n, d.alpha, (float *)d.out",
     "sp_add_one(dec, d, va, 0, n, 2.0f * d.alpha, (float *)d.out",
     "topk/thresholdv decompress() adds 2 * alpha * D (only the single-payload checks see it)"),
    ("gradiveq-decompress-alpha-dropped", "fc_cu_gradiveq.cu",
     "fc_cu_add_canon(out + lo0 + j, d.alpha * dd);", "fc_cu_add_canon(out + lo0 + j, dd);",
     "gradiveq decompress() ignores alpha"),
    ("int8-round-floor", "fc_cu_codecs.cuh",
     "float f = fc_round_even(t);", "float f = floorf(t);",
     "int8 rounds down instead of to nearest even"),
    ("topk-index16-offset", "fc_cu_select.cu",
     "((uint16_t *)region)[pos - hc.off] = (uint16_t)local;",
     "((uint16_t *)region)[pos - hc.off] = (uint16_t)(local + 1);",
     "topk's 16-bit indices written one too high"),
    ("block-lanes-halved", "fc_cu_tile.cuh",
     "return bs >= FC_CU_TILE ? 32 : (int)(bs >> 3);", "return bs >= FC_CU_TILE ? 32 : (int)(bs >> 4);",
     "a quantisation block below a tile spans half its lanes (block scales of half blocks)"),
    ("fused-decode-skips-runs", "fc_cu_decode.cuh",
     "i0 < d.out_numel; i0 += step) {", "i0 < d.out_numel; i0 += 2 * step) {",
     "the fused decode's grid-stride loop skips every other round of runs (a grid the device sized)"),
    ("sketch-table-rank-reversed", "fc_cu_sketch_table.cu",
     "const unsigned r = cnt[key] + (unsigned)__popc(peers & ((1u << lane) - 1u));",
     "const unsigned r = cnt[key] + (unsigned)__popc(peers & ~((2u << lane) - 1u));",
     "sketch tables: equal keys of a warp's row ranked high lane first (bucket sums out of index order)"),
    ("topk-cut-past-the-tie", "fc_cu_select.cu",
     "if (tie && ex + 1 == found_rank)", "if (tie && ex == found_rank)",
     "topk keeps the ties up to the next one past the cut (one tie too many, the k-th largest's)"),
    ("randomk-warp-skips-a-lane", "fc_cu_randomk.cu",
     "from = __ffs((int)m); // the lane after the one that fired",
     "from = __ffs((int)m) + 1; // the lane after the one that fired",
     "randomk's warp walks skip the event or element after each that fires"),
    ("sketch-decompress-alpha-x2", "fc_cu_sketch.cu",
     "fc_cu_add_canon((float *)d.out + idx[j], d.alpha * est[idx[j]]);",
     "fc_cu_add_canon((float *)d.out + idx[j], 2.0f * d.alpha * est[idx[j]]);",
     "sketch decompress() adds 2 * alpha * est"),
    ("onepass-flags-kept", "fc_cu_onepass.cuh",
     "        ws->enc_bad[c] = 0;\n", "",
     "a one-pass encode leaves its chunks' NaN/Inf flags set: a later call's headers and sample inherit them"),
]
QUICK = 3
# the checkout's fsdpcomp where it is built in place, else the installed one (-P: the bare source
# tree, which has no _C, stays off sys.path), as CI runs the tests
NO_CWD = [] if any(f.startswith("_C") and f.endswith(".so") for f in os.listdir(os.path.join(ROOT, "fsdpcomp"))) \
    else ["-P"]


def run_tests(src: str | None, out: str, timeout: float) -> tuple[str, float, str]:
    """The emulated test files on cuda/ at `src` (None: the checkout's). Returns (passed | failed |
    timeout, seconds, the first failing test's line)."""
    env = dict(os.environ, FSDPCOMP_EMU_DIR=out)
    env.pop("FSDPCOMP_EMU_CUDA_SRC", None)
    if src:
        env["FSDPCOMP_EMU_CUDA_SRC"] = src
    t = time.monotonic()
    try:
        r = subprocess.run([sys.executable] + NO_CWD + ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"] +
                           [os.path.join(TESTS, f) for f in FILES], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t, ""
    took = time.monotonic() - t
    if r.returncode == 0:
        return "passed", took, ""
    # the first failing test, the inner one of a wrapper (its summary is in the wrapper's message)
    found = re.findall(r"(?:FAILED|ERROR) (\S+::\S+)", r.stdout + r.stderr)
    crash = re.findall(r"(cuda_emu: [^\n]*|Fatal Python error: [^\n]*|Segmentation fault[^\n]*)", r.stdout + r.stderr)
    inner = [f for f in found if "_emulated.py" not in f] or crash or found or [(r.stdout + r.stderr)[-200:]]
    return "failed", took, os.path.basename(inner[0]).strip()[:110]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"the first {QUICK} mutants only")
    ap.add_argument("--only", action="append", default=[], help="a mutant by name (repeatable)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutant's test run")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args()
    mutants = [m for m in MUTANTS if m[0] in a.only] if a.only else MUTANTS[:QUICK] if a.quick else MUTANTS
    if a.only and len(mutants) != len(a.only):
        print(f"unknown mutant among {a.only}; have {[m[0] for m in MUTANTS]}")
        return 2
    scratch = tempfile.mkdtemp(prefix="fc_mutants_")
    out = os.path.join(scratch, "emu")  # built libraries, one per source state (build.py's tag)
    start = time.monotonic()
    try:
        if not a.no_baseline:
            res, took, why = run_tests(None, out, a.timeout)
            print(f"baseline (unmutated cuda/): {res} in {took:.0f} s {why}", flush=True)
            if res != "passed":
                return 2
        rows, bad = [], 0
        for name, f, old, new, what in mutants:
            src = os.path.join(scratch, name, "cuda")
            shutil.copytree(os.path.join(ROOT, "cuda"), src)
            path = os.path.join(src, f)
            with open(path) as fh:
                text = fh.read()
            if text.count(old) != 1:
                print(f"{name}: its text occurs {text.count(old)} times in cuda/{f} (update MUTANTS)")
                return 2
            with open(path, "w") as fh:
                fh.write(text.replace(old, new))
            res, took, why = run_tests(src, out, a.timeout)
            status = "survived" if res == "passed" else "killed"
            bad += status == "survived"
            rows.append((name, f, status, took, why or res))
            print(f"{name:36s} {status:8s} {took:5.0f} s  {why or res}", flush=True)
        print(f"\n{'mutant':36s} {'file':24s} {'result':8s} {'time':>6s}  killed by")
        for name, f, status, took, why in rows:
            print(f"{name:36s} {f:24s} {status:8s} {took:5.0f} s  {why}")
        print(f"{len(rows) - bad} of {len(rows)} killed, {time.monotonic() - start:.0f} s in all")
        return 1 if bad else 0
    finally:
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
