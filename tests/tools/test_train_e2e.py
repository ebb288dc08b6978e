"""End to end: examples/fsdp_train.py on 2 CPU ranks (tiny GPT-2, int8) writes a complete
results.jsonl line that agrees with the counters, and a resumed run continues the same loss curve."""
from __future__ import annotations

import math
import os

import pytest

from helpers.train_utils import read_jsonl, run_train, wordnet_subset

import fsdpcomp
from fsdpcomp.results import COMM_OPS, OPTIONAL_FIELDS, REQUIRED_FIELDS

pytestmark = pytest.mark.slow
STEPS = 6
COMMON = ["--model", "tiny", "--batch_size", "4", "--max_length", "32", "--eval_batches", "2",
          "--warmup_steps_discard", "1", "--log_every", "2", "--seed", "3", "--comm_compress", "int8",
          "--comm_config_json", '{"block_size": 64, "error_feedback": true, "stochastic": true, "error_stats_every": 1}']


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 2-rank run of STEPS steps that also checkpoints at step STEPS // 2."""
    base = tmp_path_factory.mktemp("train")
    train, val = wordnet_subset(str(base / "data"), 1200, 80)
    out = base / "out"
    proc = run_train(["--data_path", train, "--val_path", val, "--output_dir", str(out), "--run_name", "full",
                      "--max_steps", str(STEPS), "--save_every", str(STEPS // 2), *COMMON])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {"base": base, "out": out, "train": train, "val": val, "proc": proc}


def test_results_line_complete_and_consistent(trained):
    rows = read_jsonl(str(trained["out"] / "results.jsonl"))
    assert len(rows) == 1
    r = rows[0]
    missing = [k for k in REQUIRED_FIELDS + OPTIONAL_FIELDS if k not in r]
    assert not missing, missing
    assert r["run_name"] == "full" and r["world_size"] == 2 and r["model"] == "tiny"
    assert r["compress_method"] == "int8" and r["compress_config"]["block_size"] == 64
    assert r["compress_config"]["error_feedback"] is True
    assert (r["max_length"], r["batch_size"], r["seed"]) == (32, 4, 3)
    for key in ("step_time_ms_mean", "step_time_ms_p50", "step_time_ms_p90", "tokens_per_s",
                "comm_time_ms_total", "train_loss", "val_loss", "val_ppl", "compression_ratio"):
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    assert r["step_time_ms_p50"] <= r["step_time_ms_p90"]
    assert r["steps_timed"] == STEPS - 1
    tokens_per_step = 4 * 32 * 2
    assert r["tokens_per_s"] == pytest.approx(tokens_per_step / (r["step_time_ms_mean"] / 1000), rel=1e-9)
    assert 0 < r["comm_ratio"] < 1
    assert set(r["comm_time_ms_by_op"]) == set(COMM_OPS)
    assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]), rel=1e-9)
    assert r["train_loss"] < math.log(2048) + 1  # near or below a uniform guess, not diverged
    # Bytes: the sums of the per-rank counters the run dumped; int8 + scales is < 1/3 of fp32.
    ranks = [read_jsonl(str(trained["out"] / "logs" / "full" / f"counters_rank{i}.json"))[0] for i in range(2)]
    assert r["bytes_raw_total"] == sum(c["bytes_raw"] for c in ranks) > 0
    assert r["bytes_compressed_total"] == sum(c["bytes_compressed"] for c in ranks) > 0
    assert r["compression_ratio"] == pytest.approx(r["bytes_raw_total"] / r["bytes_compressed_total"])
    assert 3.0 < r["compression_ratio"] < 4.0
    assert all(c["calls"] > 0 and c["step"] == STEPS for c in ranks)
    assert 0 < r["grad_rel_error"] < 0.1 and 0.99 < r["grad_cos_sim"] <= 1.0
    assert r["residual_norm"] > 0  # error feedback was on
    # CPU memory is the ranks' peak RSS; an allocator's reserve is not measurable there: null.
    assert r["mem_peak_alloc_gb"] > 0 and r["mem_peak_reserved_gb"] is None
    assert r["comm_time_ms_by_op"]["all_gather"] > 0  # FSDP1's parameter all-gathers, no profiler
    assert r["val_dataset"] == "val.json" and r["val_fraction"] is None
    assert r["time_to_target_ppl_s"] is None and r["ppl_at_fixed_time"] is None
    assert r["nonfinite_steps"] == 0
    assert r["torch_version"] and r["fsdpcomp_version"] == fsdpcomp.__version__
    # The saved model is a plain transformers directory with its tokenizer.
    final = trained["out"] / "final_model" / "full"
    assert (final / "config.json").exists() and (final / "tokenizer.json").exists()
    assert any(p.suffix == ".safetensors" for p in final.iterdir())
    assert any(p.name.startswith("events.out.tfevents") for p in (trained["out"] / "logs" / "full").iterdir())


def test_resume_continues_same_loss_curve(trained):
    out = trained["out"]
    ckpt = out / "checkpoints" / "full" / f"step_{STEPS // 2}"
    assert (ckpt / "COMPLETE").exists()
    proc = run_train(["--data_path", trained["train"], "--val_path", trained["val"], "--output_dir", str(out),
                      "--run_name", "resumed", "--max_steps", str(STEPS), "--resume_from", str(ckpt), *COMMON])
    assert proc.returncode == 0, proc.stderr[-6000:]
    full = {m["step"]: m["loss"] for m in read_jsonl(str(out / "logs" / "full" / "metrics.jsonl")) if "loss" in m}
    resumed = {m["step"]: m["loss"] for m in read_jsonl(str(out / "logs" / "resumed" / "metrics.jsonl")) if "loss" in m}
    assert sorted(resumed) == list(range(STEPS // 2, STEPS))
    for step, loss in resumed.items():
        assert loss == pytest.approx(full[step], rel=1e-6, abs=1e-6), (step, loss, full[step])
    rows = {r["run_name"]: r for r in read_jsonl(str(out / "results.jsonl"))}
    assert rows["resumed"]["val_loss"] == pytest.approx(rows["full"]["val_loss"], rel=1e-6)
    assert rows["resumed"]["start_step"] == STEPS // 2


def test_resume_refuses_a_different_run(trained):
    ckpt = trained["out"] / "checkpoints" / "full" / f"step_{STEPS // 2}"
    args = [a if a != "32" else "48" for a in COMMON]  # another max_length
    proc = run_train(["--data_path", trained["train"], "--val_path", trained["val"], "--output_dir",
                      str(trained["out"]), "--run_name", "bad", "--max_steps", str(STEPS), "--resume_from",
                      str(ckpt), *args])
    assert proc.returncode != 0
    assert "max_length" in proc.stderr and "differs from the checkpoint" in proc.stderr


def test_bad_data_path_is_named(tmp_path):
    missing = str(tmp_path / "nope.json")
    proc = run_train(["--data_path", missing, "--output_dir", str(tmp_path / "o"), "--max_steps", "5",
                      "--model", "tiny"], world=1)
    assert proc.returncode != 0
    assert f"{missing}: no such file" in proc.stderr


def test_notebook_executes(trained, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    from helpers.pkg_path import pythonpath
    from helpers.train_utils import EXAMPLES

    monkeypatch.setenv("PYTHONPATH", pythonpath())
    monkeypatch.setenv("FSDPCOMP_RESULTS", str(trained["out"] / "results.jsonl"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(os.path.join(EXAMPLES, "inspect_counters.ipynb"), as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(trained["base"])}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("fsdpcomp-counters" in h and "bytes_sent" in h for h in html)
    text = "".join(o.get("text", "") for o in outputs)
    assert "runs in" in text and "full" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
