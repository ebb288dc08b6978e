# comm_bench end to end at a tiny size on 2 unshaped ranks: it runs, validates every method and writes a consistent JSON.
import json
import os
import subprocess
import sys

import pytest

import fsdpcomp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "comm_bench.py")


def _run(args, out_dir):
    # the benchmark picks its fsdpcomp itself: built in place in the checkout, else installed
    return subprocess.run([sys.executable, BENCH, "--out_dir", str(out_dir)] + args,
                          capture_output=True, text=True, timeout=240, cwd=REPO)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("comm_bench")
    proc = _run(["--world", "2", "--sizes", "64K", "--links", "unshaped", "--reps", "2",
                 "--kernels_json", str(out / "absent.json")], out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "comm_bench.json") as f:
        return proc.stdout, json.load(f), out


def test_every_method_and_baseline_is_measured_and_correct(bench):
    _, data, _ = bench
    (run,) = data["runs"]
    assert run["world"] == 2 and run["shaped"] is False and run["link_check_gbit"] > 0
    (size,) = run["sizes"]
    assert size["numel"] == 64 * 1024
    names = [r["method"] for r in size["rows"]]
    assert names[:3] == ["torch_reduce_scatter", "none", "torch_bf16_hook"]
    # the codecs: powersgd needs a model's matrices, which a flat reduce-scatter does not have
    assert sorted(names[3:]) == sorted(m for m in fsdpcomp.codecs() if m != "none")
    for r in size["rows"]:
        assert not r["wrong"] and r["finite"], r["method"]
        assert len(r["times_s"]) == 2 and all(t > 0 for t in r["times_s"])
        assert r["p90_s"] >= r["median_s"] > 0
        assert r["speedup_vs_none"] == pytest.approx(
            next(x for x in size["rows"] if x["method"] == "none")["median_s"] / r["median_s"])
    none = size["rows"][1]
    # `none` is exact up to fp32 summation order, and sends the raw bytes plus one header per chunk.
    assert none["rel_err"] < 1e-6
    assert none["bytes_raw"] == 32 * 1024 * 4
    assert 0 < none["bytes_sent"] - none["bytes_raw"] <= 64
    assert data["wrong"] == 0


def test_byte_accounting_matches_the_ratio(bench):
    _, data, _ = bench
    # the summary keeps 9 significant digits of a float (benchmarks/results_io.py's SUMMARY_DIGITS),
    # the byte counts whole: the ratio agrees with them to rounding in the ninth digit
    for r in data["runs"][0]["sizes"][0]["rows"]:
        assert r["ratio"] == pytest.approx(r["bytes_raw"] / r["bytes_sent"], rel=1e-8)
        assert r["ideal_speedup"] == pytest.approx(r["ratio"], rel=1e-8)
    int8 = next((r for r in data["runs"][0]["sizes"][0]["rows"] if r["method"] == "int8"), None)
    if int8 is not None:
        assert 3.5 < int8["ratio"] < 4.0  # 8 bits + a 32-bit scale per block, vs fp32


def test_output_is_labelled(bench):
    stdout, data, out = bench
    assert "wire bytes not measured on loopback" in stdout
    assert "PROJECTED cluster table" in stdout and "needs GPU kernel times" in stdout
    assert "PROJECTED step speedup" in stdout
    assert data["cluster"]["kernel_times"] is False and data["cluster"]["rows"]
    assert data["meta"]["torch"] and data["meta"]["fsdpcomp"] == fsdpcomp.__version__
    # each method's resolved config once, in meta, not in every row of every size and link
    configs = data["meta"]["configs"]
    assert configs["int8"]["block_size"] == 256 and configs["torch_reduce_scatter"] is None
    assert not any("config" in r for r in data["runs"][0]["sizes"][0]["rows"])
    if data["meta"].get("plot") is None:
        assert (out / "comm_bench.png").stat().st_size > 1000


def test_bad_flags_are_refused(tmp_path):
    proc = _run(["--sizes", "lots"], tmp_path)
    assert proc.returncode == 2 and "size must be a count" in proc.stderr
    proc = _run(["--world", "1"], tmp_path)
    assert proc.returncode == 2 and "--world takes rank counts from 2 to 8, got 1" in proc.stderr


def test_step_projection_is_bounded_by_the_uncompressed_all_gathers():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
    import projection
    numel, world, gbit, alpha = 64 << 20, 8, 100.0, 10e-6
    rs = projection.ring_rs_time(numel, 4, world, gbit, alpha)
    rows = [{"gbit": gbit, "world": world, "method": "same", "ratio": 1.0, "time_s": rs},
            {"gbit": gbit, "world": world, "method": "free", "ratio": 1e9, "time_s": 0.0}]
    same, free = projection.step_table(rows, numel, alpha, compute_s=0.01)
    assert same["speedup_no_overlap"] == pytest.approx(1.0) and same["speedup_full_overlap"] == pytest.approx(1.0)
    # a reduce-scatter that costs nothing leaves compute and two all-gathers (each as long as rs)
    assert free["speedup_no_overlap"] == pytest.approx((0.01 + 3 * rs) / (0.01 + 2 * rs))
    assert free["speedup_full_overlap"] == pytest.approx(max(0.01, 3 * rs) / max(0.01, 2 * rs))
