"""benchmarks/projection.py takes its GPU codec times from the kernel table the repository keeps
(benchmarks/results/gpu/kernels_cuda.json): the newest run's rows unless told another, the run
named (date, commit, device) wherever its numbers are used, and a method without a measured row
refused by name, never projected with a codec time of 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import projection  # noqa: E402

COMMITTED = os.path.join(ROOT, "benchmarks", "results", "gpu", "kernels_cuda.json")


def _committed():
    with open(COMMITTED) as f:
        return json.load(f)


def test_reads_the_newest_run_of_the_committed_table():
    data = _committed()
    assert projection.KERNELS_JSON == COMMITTED
    kernels, info = projection.load_gpu_kernels()
    newest = max(r["run"] for r in data["rows"] if r["method"] != "d2d copy")
    assert info["run"] == newest and info["path"] == COMMITTED
    record = next(r for r in data["runs"] if r["run"] == newest)
    assert (info["date"], info["commit"], info["device"]) == (record["updated"], record["commit"], record["device"])
    # exactly the methods that run timed at their defaults, each from its largest size
    timed = [r for r in data["rows"] if r.get("run") == newest and r["method"] != "d2d copy"
             and r.get("variant", "plain") == "plain" and not r.get("ef")]
    assert set(kernels) == {r["method"] for r in timed}
    for m, k in kernels.items():
        row = max((r for r in timed if r["method"] == m), key=lambda r: r["n"])
        assert k["numel"] == row["n"]
        assert k["encode_s_per_elem"] == pytest.approx(row["enc_ms"] / 1e3 / row["n"])
        assert k["decode_s_per_elem"] == pytest.approx(row["dec_ms"] / 1e3 / row["n"])
    said = projection.describe(info)
    assert f"run {newest}" in said and record["updated"][:10] in said and record["device"] in said
    assert (f"commit {record['commit']}" if record["commit"] else "commit not recorded") in said


def test_an_earlier_run_on_request():
    data = _committed()
    runs = sorted({r["run"] for r in data["rows"] if r["method"] != "d2d copy"})
    if len(runs) < 2:
        pytest.skip("the committed table holds one run")
    kernels, info = projection.load_gpu_kernels(run=runs[0])
    assert info["run"] == runs[0]
    assert set(kernels) == {r["method"] for r in data["rows"] if r.get("run") == runs[0]
                            and r["method"] != "d2d copy" and not r.get("ef")}
    with pytest.raises(ValueError, match="no timed kernel rows of run 999"):
        projection.load_gpu_kernels(run=999)


def test_a_method_without_a_row_is_refused_by_name():
    kernels, info = projection.load_gpu_kernels()
    have = sorted(kernels)
    missing = "no_such_codec"
    with pytest.raises(projection.NoKernelTimes, match=f"no measured GPU codec time for {missing} in run {info['run']}"):
        projection.cluster_table({have[0]: 4.0, missing: 4.0}, kernels, 1 << 26, [8], [100.0], 10e-6, info)
    # the methods it has are projected with their codec times: slower than the codec-free bound
    (with_codec,) = projection.cluster_table({have[0]: 4.0}, kernels, 1 << 26, [8], [100.0], 10e-6, info)
    (bound,) = projection.cluster_table({have[0]: 4.0}, None, 1 << 26, [8], [100.0], 10e-6)
    k = kernels[have[0]]
    codec = (k["encode_s_per_elem"] + k["decode_s_per_elem"]) * (1 << 26) * 7 / 8
    assert with_codec["kernel_times"] and not bound["kernel_times"]
    assert with_codec["time_s"] == pytest.approx(bound["time_s"] + codec)


def test_failed_and_error_feedback_rows_never_feed_it(tmp_path):
    """Only rows checked against the CPU and timed at the method's defaults count."""
    rows = [{"method": "int8", "n": 1 << 26, "enc_ms": 1.0, "dec_ms": 1.0, "run": 3, "status": "passed",
             "variant": "plain"},
            {"method": "int8+ef", "base": "int8", "n": 1 << 26, "enc_ms": 9.0, "dec_ms": 9.0, "run": 3,
             "status": "passed", "variant": "ef", "ef": True},
            {"method": "fp8", "n": 1 << 26, "enc_ms": None, "dec_ms": None, "run": 3, "status": "failed", "wrong": 5}]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"device": "X", "rows": rows, "runs": [{"run": 3, "updated": "2026-12-01T00:00:00",
                                                                      "commit": "abc1234", "device": "X"}]}))
    kernels, info = projection.load_gpu_kernels(str(path))
    assert set(kernels) == {"int8"} and kernels["int8"]["encode_s_per_elem"] == pytest.approx(1e-3 / (1 << 26))
    assert projection.describe(info) == f"run 3 (2026-12-01, commit abc1234, X) of {path}"
    with pytest.raises(projection.NoKernelTimes, match="fp8"):
        projection.require(kernels, ["int8", "fp8"], info)


def test_the_command_names_the_run_and_refuses_a_method_without_a_row():
    run = lambda *a: subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "projection.py"), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120, cwd=ROOT)
    kernels, info = projection.load_gpu_kernels()
    ok = run("--methods", sorted(kernels)[0])
    assert ok.returncode == 0, ok.stderr
    assert "PROJECTED" in ok.stdout and f"GPU codec times from {projection.describe(info)}" in ok.stdout
    bad = run("--methods", f"{sorted(kernels)[0]},no_such_codec")
    assert bad.returncode == 2 and "no measured GPU codec time for no_such_codec" in bad.stderr
    gone = run("--kernels", os.path.join(ROOT, "no", "such.json"))
    assert gone.returncode == 2 and "no GPU kernel table at" in gone.stderr


def test_comm_bench_form_without_a_file_is_the_labelled_bound(tmp_path):
    kernels, note = projection.load_kernel_times(str(tmp_path / "absent.json"))
    assert kernels == {} and note.startswith("needs GPU kernel times")
