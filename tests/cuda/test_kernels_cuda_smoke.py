"""benchmarks/kernels_cuda.py without a GPU: it imports, refuses bad flags, lists every row it would
time with issue 37's targets (encode and decode each; the fixed cost at 2^16; none on the +ef and
+sampled rows), splits the full table between tests/gpu/run.sh's two profiles, and runs end to end
on the emulated CUDA library (tests/cuda_emu): every case checked against the CPU, then timed,
and a JSON that make_results_md.py and projection.py read."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import fsdpcomp
from helpers.pkg_path import pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(REPO, "benchmarks", "kernels_cuda.py")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

N16, N24, N26, N28 = 1 << 16, 1 << 24, 1 << 26, 1 << 28


def _run(args, env=None):
    env = dict(os.environ if env is None else env, PYTHONPATH=pythonpath())  # the fsdpcomp this run imported
    return subprocess.run([sys.executable, "-P", BENCH] + args, capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=env)


def _listed(*args):
    proc = _run(["--list", *args])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line.split() for line in proc.stdout.splitlines()[1:]]  # case n encode decode cuda


def test_lists_every_method_with_its_targets():
    rows = {(r[0], int(r[1])): r[2:] for r in _listed("--profile", "quick") + _listed("--profile", "rest")}
    for m in fsdpcomp.codecs():  # every method at its (benchmarked) defaults
        assert any(case == ("thresholdv-th2.5" if m == "thresholdv" else m) for case, _ in rows), m
    expect = {("none", N26): [">=90%", ">=90%"], ("int8", N26): [">=80%", ">=80%"],
              ("onebit", N26): [">=80%", ">=80%"], ("signsgd-majority", N26): [">=80%", ">=80%"],
              ("topk", N26): [">=25%", ">=25%"], ("topk-ra0.3", N26): [">=25%", ">=25%"],
              ("thresholdv-th2.5", N26): [">=25%", ">=25%"], ("randomk", N26): [">=50%", ">=50%"],
              ("randomk-int8", N26): [">=50%", ">=50%"], ("sketch", N26): [">=10%", ">=10%"],
              ("dct", N26): [">=10%", ">=10%"], ("gradiveq", N24): ["<=32.2ms", "-"],
              ("int8", N16): ["<=5us", "<=5us"], ("gradiveq", N16): ["<=5us", "<=5us"],
              ("int8+ef", N26): ["-", "-"], ("int8+sampled", N26): ["-", "-"], ("int8", N24): ["-", "-"],
              ("int8", N28): ["-", "-"], ("fp16", N26): ["-", "-"]}
    for key, targets in expect.items():
        assert rows[key][:2] == targets, (key, rows.get(key))
        assert rows[key][2] == str(bool(fsdpcomp.method_info(key[0].split("-")[0].split("+")[0]).get("cuda"))), key


def test_quick_and_rest_split_the_full_table():
    """tests/gpu/run.sh's two GPU commands time the full table between them, no row twice; quick
    is every method at the size it is judged at and at 2^16, and int8's +ef and +sampled."""
    quick = [tuple(r[:2]) for r in _listed("--profile", "quick")]
    rest = [tuple(r[:2]) for r in _listed("--profile", "rest")]
    assert len(quick) == len(set(quick)) and len(rest) == len(set(rest)) and not set(quick) & set(rest)
    judged = {m: N24 if m == "gradiveq" else N26 for m in fsdpcomp.codecs()}
    base = {m: "thresholdv-th2.5" if m == "thresholdv" else m for m in fsdpcomp.codecs()}
    want = {(base[m], str(n)) for m in fsdpcomp.codecs() for n in (judged[m], N16)}
    assert set(quick) == want | {("int8+ef", str(N26)), ("int8+sampled", str(N26))}
    # rest: every config variant, every +ef and +sampled, every method at 2^24 and 2^28 (gradiveq at neither)
    assert ("topk-ra0.3", str(N26)) in rest and ("intN-bi3-minmax", str(N26)) in rest
    for m in fsdpcomp.codecs():
        assert (f"{base[m]}+ef", str(judged[m])) in rest + quick and (f"{base[m]}+sampled", str(judged[m])) in rest + quick
        if m != "gradiveq":
            assert (base[m], str(N24)) in rest and (base[m], str(N28)) in rest
    assert not [r for r in rest if r[0] == "gradiveq" and r[1] in (str(N26), str(N28))]


def test_bad_flags_are_refused():
    proc = _run(["--sizes", "lots"])
    assert proc.returncode == 2 and "--sizes must be comma-separated counts" in proc.stderr
    proc = _run(["--reps", "0", "--list"])
    assert proc.returncode == 2 and "--reps at least 1" in proc.stderr
    proc = _run(["--validate-numel", "0", "--list"])
    assert proc.returncode == 2 and "--validate-numel must be at least 1" in proc.stderr


def test_without_a_gpu_it_says_so():
    import torch
    if torch.cuda.is_available():
        return
    proc = _run(["--sizes", "1K"])
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


@pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")),
                    reason="no C++ compiler for the CUDA emulation")
def test_runs_end_to_end_on_the_emulated_library(tmp_path):
    """The whole benchmark on the emulated CUDA library at 2^16 elements (the fixed-cost size):
    each case checked against the CPU and passing, then timed, its bytes (minimum; the model for
    the dense codecs only), its targets judged, and a JSON the results page and the projection
    read. The times are the host's: nothing here says anything about speed."""
    sys.path.insert(0, os.path.join(REPO, "tests", "cuda_emu"))
    import build as emu_build
    lib = emu_build.build_shared(os.environ.get("FSDPCOMP_EMU_DIR") or
                                 os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}"))
    env = dict(os.environ, FSDPCOMP_CUDA_LIB=lib, FSDPCOMP_TEST_EMULATED="1")
    out = tmp_path / "kernels.json"
    cases = "int8,int8+ef,int8+sampled,topk,gradiveq"
    proc = _run(["--emulated", "--sizes", "64K", "--reps", "1", "--validate-numel", "4099", "--methods", cases,
                 "--json", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["emulated"] is True and data["failed"] == [] and data["methods_wrong"] == 0
    copy, *rows = data["rows"]
    assert copy["method"] == "d2d copy" and copy["n"] == N16 and copy["GBps"] > 0
    assert [r["method"] for r in rows] == cases.split(",")
    by = {r["method"]: r for r in rows}
    for r in rows:
        assert r["status"] == "passed" and r["wrong"] == 0 and r["n"] == N16, r
        assert r["enc_ms"] > 0 and r["dec_ms"] > 0 and r["payload_bytes"] > 0
        assert r["enc_frac_copy"] == pytest.approx(r["enc_min_bytes"] / (r["enc_ms"] / 1e3) / 1e9 / copy["GBps"])
        assert r["dec_min_bytes"] == r["payload_bytes"] + 4 * N16
    # minimum bytes: g read, payload written, with error feedback e read and written
    assert by["int8"]["enc_min_bytes"] == 4 * N16 + by["int8"]["payload_bytes"]
    assert by["int8+ef"]["enc_min_bytes"] == 12 * N16 + by["int8+ef"]["payload_bytes"] and by["int8+ef"]["ef"]
    # the model covers the dense codecs (a count pass + the codec's pass), and says it is a model
    assert by["int8"]["enc_moved_bytes"] == 8 * N16 + by["int8"]["payload_bytes"]
    assert by["int8"]["moved_source"] in ("model", "model, stale")
    assert by["topk"]["enc_moved_bytes"] is None and by["topk"]["moved_source"] is None
    # targets at 2^16: the fixed cost, encode and decode; none on the +ef / +sampled rows
    assert by["int8"]["enc_target"] == {"kind": "us", "value": 5.0} and by["int8"]["enc_met"] is False
    assert by["int8"]["target_met"] is False and by["int8+ef"]["enc_target"] is None
    assert by["int8+sampled"]["target_met"] is None

    # collected as a GPU run is (tests/gpu/collect.py), the results page shows it, and the
    # projection reads its rows at the methods' defaults
    sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
    import collect
    import projection
    import results_gpu
    run_dir = tmp_path / "gpu_run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"checks": {"bench.kernels_cuda_quick": {
        "status": "passed", "seconds": 1.0, "detail": data}}, "updated": "2026-12-01T00:00:00+0000"}))
    (run_dir / "env.json").write_text(json.dumps({"device": data["device"], "torch": data["torch"]}))
    (run_dir / "kernels_quick.json").write_text(out.read_text())
    summary, kernels = collect.collect([str(run_dir)], ["emulated, main 0123abc"])
    results = tmp_path / "results"
    (results / "gpu").mkdir(parents=True)
    for name, obj in (("summary.json", summary), ("kernels_cuda.json", kernels)):
        (results / "gpu" / name).write_text(json.dumps(obj))
    page = "\n".join(results_gpu.gpu_section(str(results)))
    assert "run 0 (2026-12-01, commit 0123abc" in page
    int8_line = next(ln for ln in page.splitlines() if ln.startswith("| int8 |"))
    assert "| 5.02n / 9.02n model" in int8_line and "enc <= 5 us **missed**" in int8_line
    assert next(ln for ln in page.splitlines() if ln.startswith("| topk |")).count("/ -") == 2
    assert "Earlier runs" not in page
    times, info = projection.load_gpu_kernels(str(results / "gpu" / "kernels_cuda.json"))
    assert set(times) == {"int8", "topk", "gradiveq"} and info["commit"] == "0123abc"


def test_each_side_is_judged_and_a_failed_row_has_no_times():
    import kernels_cuda
    row = kernels_cuda.failed_row("int8", {}, "plain", N26, 7, None)
    assert row["status"] == "failed" and row["wrong"] == 7 and row["enc_ms"] is None and row["target_met"] is None
    r = {"enc_frac_copy": 0.85, "dec_frac_copy": 0.5, "enc_ms": 1.0, "dec_ms": 1.0}
    kernels_cuda.judge(r, kernels_cuda.targets_of("int8", "plain", N26))
    assert (r["enc_met"], r["dec_met"], r["target_met"], r["target"]) == (True, False, False, 0.8)
    r = {"enc_frac_copy": 0.0, "dec_frac_copy": 0.0, "enc_ms": 30.0, "dec_ms": 1.0}
    kernels_cuda.judge(r, kernels_cuda.targets_of("gradiveq", "plain", N24))
    assert (r["enc_met"], r["dec_met"], r["target_met"], r["target"]) == (True, None, True, None)
