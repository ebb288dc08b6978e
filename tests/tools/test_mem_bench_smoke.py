# mem_bench end to end on 2 ranks, tiny model, one method: the measured row matches the computed one, a refused residual dtype is listed as skipped, and the results page shows the section.
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "mem_bench.py")
pytestmark = pytest.mark.slow  # two ranks train a few steps


def _run(base):
    # "fp8" is no residual dtype: the config refuses it, and the benchmark lists it as skipped
    args = [sys.executable, "-P", BENCH, "--model", "tiny", "--world", "2", "--methods", "topk",
            "--residual_dtypes", "fp32", "fp8", "--steps", "1", "--batch_size", "2", "--max_length", "16",
            "--work_dir", str(base / "runs"), "--out_dir", str(base / "out")]
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONSAFEPATH="1")
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    base = tmp_path_factory.mktemp("mem_bench")
    proc = _run(base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(base / "out" / "mem_bench_tiny.json") as f:
        return json.load(f), proc.stdout, base


def test_measured_row_matches_the_computed_one(bench):
    data, stdout, _ = bench
    (row,) = data["measured"]
    assert (row["method"], row["residual_dtype"], row["world"]) == ("topk", "fp32", 2)
    assert row["within"] and row["counters_equal_tensors"]
    # the tiny model's dims are even: FSDP2 pads nothing, so the parts are exact
    assert (row["params"], row["grads"], row["residual"]) == (2.0, 2.0, 4.0)
    assert row["optimizer"] == pytest.approx(4.0, rel=1e-3)  # AdamW's m, v and a 4-byte step each
    assert 0 < row["buffers"] <= row["buffer_peak"] and row["rss_growth"] > 0
    assert set(row["buffers_by_kind"]) == {"send", "recv"}
    (skip,) = data["skipped"]
    assert skip["residual_dtype"] == "fp8" and "residual_dtype" in skip["why"]
    assert "residual fp8: skipped" in stdout and "| topk | fp32 | 2 |" in stdout


def test_computed_rows_cover_every_world_and_the_7b_model(bench):
    data, _, _ = bench
    for model in ("tiny", "llama-7b"):
        rows = [r for r in data["computed"] if r["model"] == model]
        assert [r["world"] for r in rows] == [2 ** k for k in range(1, 11)]
        for r in rows:
            assert r["plain_fsdp2"] == pytest.approx(16 / r["world"])
            # the residual does not divide by W: the unit's whole gradient on every rank
            assert r["residual_fp32"] >= 4.0 and r["residual_bf16"] == pytest.approx(r["residual_fp32"] / 2)
            assert r["residual_int8"] == pytest.approx(r["residual_fp32"] * (1 + 4 / 64) / 4)
    llama = {r["world"]: r for r in data["computed"] if r["model"] == "llama-7b"}
    assert llama[8]["model_params"] == 6_738_415_616 and llama[8]["residual_fp32"] == pytest.approx(4.0)


def test_results_page_has_the_memory_section(bench, tmp_path):
    _, _, base = bench
    spec = importlib.util.spec_from_file_location("make_results_md", os.path.join(REPO, "benchmarks", "make_results_md.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = tmp_path / "results.md"
    gen.main(["--results_dir", str(base / "out"), "--out", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "## Memory per rank" in text and "1 of 1 measured rows match" in text
    assert "| topk | fp32 | 2 |" in text and "skipped: topk with residual_dtype fp8" in text
    assert "python benchmarks/mem_bench.py --model tiny" in text  # the command that made it
