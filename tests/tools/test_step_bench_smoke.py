# step_bench end to end on 2 unshaped ranks, tiny model, a few steps: it runs every phase, resumes, and writes a consistent JSON, under `python -P`.
import gzip
import json
import os
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath
from helpers.train_utils import wordnet_subset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "step_bench.py")


def _run(base, data):
    # -P and PYTHONSAFEPATH (inherited by the ranks): no script folder on sys.path, as README
    # recommends; the benchmark and its workers find their siblings themselves
    args = [sys.executable, "-P", BENCH, "--model", "tiny", "--configs", "none", "int8+int8", "--links", "unshaped",
            "--phases", "timing", "quality", "--warmup", "1", "--timing_steps", "2", "--quality_steps", "3",
            "--eval_every", "0", "--eval_batches", "1", "--batch_size", "2", "--max_length", "32",
            "--data_path", data[0], "--val_path", data[1], "--cache_dir", str(base / "cache"),
            "--work_dir", str(base / "runs"), "--out_dir", str(base / "out"), "--curves_dir", str(base / "curves")]
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONSAFEPATH="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    base = tmp_path_factory.mktemp("step_bench")
    data = wordnet_subset(str(base / "data"), 600, 40)
    proc = _run(base, data)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(base / "out" / "step_bench_tiny.json") as f:
        first = json.load(f)
    again = _run(base, data)  # every run saved: the second invocation only reads them back
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return first, again.stdout, base


def test_timing_rows_split_the_step_and_count_bytes(bench):
    data, _, _ = bench
    rows = {r["config"]: r for r in data["timing"]}
    assert set(rows) == {"none", "int8+int8"}
    for r in rows.values():
        assert r["timed_steps"] == 2 and r["step_s"] > 0 and r["all_gather_s"] > 0 and r["reduce_scatter_s"] > 0
        assert r["compute_s"] == pytest.approx(r["step_s"] - r["all_gather_s"] - r["reduce_scatter_s"])
        assert r["wire_bytes"] is None  # unshaped: no link of its own to count
    none, q = rows["none"], rows["int8+int8"]
    assert none["speedup"] == pytest.approx(1.0) and none["bound"] == pytest.approx(1.0)
    # int8 payloads: just under a quarter of fp32 on both paths (tiny shards: headers weigh more)
    assert 2.5 < none["rs_bytes"] / q["rs_bytes"] < 4 and 2.5 < none["ag_bytes"] / q["ag_bytes"] < 4
    assert q["bytes_ratio"] == pytest.approx(none["total_bytes"] / q["total_bytes"])
    assert 1 < q["bound"] < q["comm_free_bound"]
    assert q["codec_s"] > 0


def test_quality_rows_and_resume(bench):
    data, again, base = bench
    rows = {r["config"]: r for r in data["quality"]}
    assert rows["none"]["delta_ppl_pct"] == 0 and rows["none"]["val_ppl"] > 1
    assert rows["int8+int8"]["delta_ppl_pct"] is not None and rows["int8+int8"]["steps"] == 3
    # the summary holds no per-step curve; the curves file beside it (outside git) holds them
    assert "quality_runs" not in data and set(data) == {"meta", "timing", "quality", "targets"}
    with gzip.open(base / "curves" / "step_bench_tiny.json.gz", "rt") as f:
        curves = json.load(f)
    assert len(curves) == 2 and all(len(r["losses"]) == 3 for r in curves)
    assert again.count("done before") == 4  # nothing ran twice
    assert any(t["target"].startswith("total FSDP bytes") for t in data["targets"])


def test_step_projection_with_compressed_gathers():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import projection
    numel, world, gbit, alpha, compute = 64 << 20, 8, 100.0, 10e-6, 0.01
    rs = projection.ring_rs_time(numel, 4, world, gbit, alpha)
    rows = [{"gbit": gbit, "world": world, "method": "free", "ratio": 1e9, "time_s": 0.0}]
    (plain,) = projection.step_table(rows, numel, alpha, compute)
    assert "step_s_gathers" not in plain
    (same,) = projection.step_table(rows, numel, alpha, compute, gather_ratio=1.0)
    assert same["speedup_no_overlap_gathers"] == pytest.approx(plain["speedup_no_overlap"])
    (q,) = projection.step_table(rows, numel, alpha, compute, gather_ratio=4.0)
    ag4 = projection.ring_rs_time(numel, 1, world, gbit, alpha)  # a quarter of the bytes, the same messages
    assert q["step_s_gathers"] == pytest.approx(compute + 2 * ag4)
    assert q["speedup_no_overlap_gathers"] == pytest.approx((compute + 3 * rs) / (compute + 2 * ag4))
    # a codec's time is added per gather: encode of the own shard, decode of all W
    kernel = {"encode_s_per_elem": 1e-12, "decode_s_per_elem": 2e-12}
    (k,) = projection.step_table(rows, numel, alpha, compute, gather_ratio=4.0, gather_kernel=kernel)
    assert k["step_s_gathers"] - q["step_s_gathers"] == pytest.approx(2 * (1e-12 * numel / world + 2e-12 * numel))
