"""benchmarks/kernels_cuda.py without a GPU: it imports, refuses bad flags, and lists every case it
would measure (the sparse methods and their variants with their 25% selection target,
sketch and gradiveq without one) with this build's CUDA flag per method."""
from __future__ import annotations

import os
import subprocess
import sys

import fsdpcomp
from helpers.pkg_path import pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(REPO, "benchmarks", "kernels_cuda.py")


def _run(args):
    env = dict(os.environ, PYTHONPATH=pythonpath())  # the fsdpcomp this run imported
    return subprocess.run([sys.executable, "-P", BENCH] + args, capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env)


def test_lists_every_method_and_the_sparse_variants():
    proc = _run(["--list"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: line.split()[2:] for line in proc.stdout.splitlines()[1:]}  # case n target cuda
    for m in fsdpcomp.codecs():
        assert m in rows or any(r.startswith(m) for r in rows), m
    for case, target in [("topk", "25%"), ("topk-int8", "25%"), ("topk-ra0.3", "25%"), ("randomk-int8", "25%"),
                         ("thresholdv-th2.5", "25%"), ("thresholdv-th2.5-sign", "25%"),
                         ("signsgd-majority", "80%"), ("sketch", "-"), ("gradiveq", "-"), ("int8", "80%")]:
        assert rows[case][0] == target, (case, rows.get(case))
        assert rows[case][1] == str(bool(fsdpcomp.method_info(case.split("-")[0]).get("cuda"))), case


def _rows(profile):
    proc = _run(["--list", "--profile", profile])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [tuple(line.split()[:2]) for line in proc.stdout.splitlines()[1:]]


def test_quick_and_rest_split_the_full_table():
    """tests/gpu/run.sh's two GPU commands time the full table between them, no row twice;
    quick is the six first codecs at 2^24 and 2^26 elements."""
    full, quick, rest = _rows("all"), _rows("quick"), _rows("rest")
    assert len(full) == len(set(full)) and sorted(quick + rest) == sorted(full)
    assert sorted(quick) == sorted((m, str(n)) for m in ("int8", "fp8", "intN", "topk", "sketch", "onebit")
                                   for n in (1 << 24, 1 << 26))
    assert {n for _, n in full} == {str(1 << 24), str(1 << 26), str(1 << 28)}


def test_bad_flags_are_refused():
    proc = _run(["--sizes", "lots"])
    assert proc.returncode == 2 and "--sizes must be comma-separated counts" in proc.stderr
    proc = _run(["--reps", "0", "--list"])
    assert proc.returncode == 2 and "--reps at least 1" in proc.stderr


def test_without_a_gpu_it_says_so():
    import torch
    if torch.cuda.is_available():
        return
    proc = _run(["--sizes", "1K"])
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
