"""Where a run's files go (issue 31). The default run_name names the parallelism and a hash of the
settings that change results, so an FSDP2 int8 run after an FSDP1 int8 run into the same
--output_dir keeps its own final_model/, counters, metrics.jsonl and TensorBoard folder (they
shared all four: `tiny-int8-w2`). A folder that holds a run is never written into by another: a
fresh suffix for a default name, a refusal for an explicit --run_name; a resume of that run
continues in it. And generate.py / validate_model.py given final_model/ itself (README named it)
say which run folders it holds, instead of a tokenizer error about sentencepiece/tiktoken."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath
from helpers.train_utils import EXAMPLES, read_jsonl, run_train, wordnet_subset

pytestmark = pytest.mark.slow
STEPS = 4
COMMON = ["--model", "tiny", "--batch_size", "4", "--max_length", "32", "--eval_batches", "2",
          "--warmup_steps_discard", "1", "--max_steps", str(STEPS), "--log_every", "2", "--seed", "5",
          "--comm_compress", "int8", "--comm_config_json", '{"error_feedback": true}']


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An FSDP1 and then an FSDP2 int8 run, otherwise alike, into one output_dir (the first
    checkpoints at step 2); the results lines as they were right after the two."""
    base = tmp_path_factory.mktemp("runs")
    train, val = wordnet_subset(str(base / "data"), 600, 40)
    out = base / "out"
    data = ["--data_path", train, "--val_path", val, "--output_dir", str(out)]
    for parallel, extra in (("fsdp1", ["--save_every", "2"]), ("fsdp2", [])):
        proc = run_train([*data, "--parallel", parallel, *extra, *COMMON])
        assert proc.returncode == 0, proc.stderr[-6000:]
    rows = read_jsonl(str(out / "results.jsonl"))
    return {"base": base, "out": out, "data": data, "val": val, "rows": rows,
            "names": {r["parallel"]: r["run_name"] for r in rows}}


def _train_steps(out, name) -> list[int]:
    return [m["step"] for m in read_jsonl(str(out / "logs" / name / "metrics.jsonl")) if "loss" in m]


def test_fsdp1_and_fsdp2_runs_keep_their_own_folders(runs):
    out, names = runs["out"], runs["names"]
    assert len(runs["rows"]) == 2 and len(set(names.values())) == 2, names
    for parallel, name in names.items():
        assert name.startswith(f"tiny-int8-{parallel}-w2-"), name  # and the settings' hash
        row = next(r for r in runs["rows"] if r["run_name"] == name)
        assert name.endswith(row["run_hash"]) and len(row["run_hash"]) == 8
        assert _train_steps(out, name) == list(range(STEPS))  # its own curve, nobody else's
        logs = out / "logs" / name
        assert len([p for p in logs.iterdir() if p.name.startswith("events.out.tfevents")]) == 1
        ranks = [json.loads((logs / f"counters_rank{i}.json").read_text()) for i in range(2)]
        assert row["bytes_raw_total"] == sum(c["bytes_raw"] for c in ranks)  # these counters are this run's
        assert (out / "final_model" / name / "config.json").exists()
        run = json.loads((logs / "run.json").read_text())
        assert run["hash"] == row["run_hash"] and run["status"] == "finished" and run["step"] == STEPS
        assert run["settings"]["parallel"] == parallel and run["settings"]["comm_config"]["error_feedback"] is True
    assert names["fsdp1"][-8:] != names["fsdp2"][-8:]


def test_rerun_gets_a_fresh_folder_and_a_resume_continues_its_own(runs):
    out, first = runs["out"], runs["names"]["fsdp1"]
    before = (out / "logs" / first / "metrics.jsonl").read_text()
    rerun = run_train([*runs["data"], "--parallel", "fsdp1", *COMMON])  # the same settings again
    assert rerun.returncode == 0, rerun.stderr[-6000:]
    rows = read_jsonl(str(out / "results.jsonl"))
    assert rows[-1]["run_name"] == f"{first}-2" and rows[-1]["run_hash"] == first[-8:]
    assert f"{first}-2" in rerun.stderr  # the log says where this run went
    assert (out / "logs" / first / "metrics.jsonl").read_text() == before
    assert _train_steps(out, f"{first}-2") == list(range(STEPS))
    # the first run's checkpoint, resumed with its settings: the same name, the same folders
    ckpt = out / "checkpoints" / first / "step_2"
    resumed = run_train([*runs["data"], "--parallel", "fsdp1", "--resume_from", str(ckpt), *COMMON])
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    row = read_jsonl(str(out / "results.jsonl"))[-1]
    assert row["run_name"] == first and row["start_step"] == 2
    losses = [(m["step"], m["loss"]) for m in read_jsonl(str(out / "logs" / first / "metrics.jsonl")) if "loss" in m]
    assert [s for s, _ in losses] == [0, 1, 2, 3, 2, 3]  # the resume continues its own curve
    for again, first_time in ((4, 2), (5, 3)):
        assert losses[again][1] == pytest.approx(losses[first_time][1], rel=1e-6)


def test_an_explicit_run_name_in_use_is_refused(runs):
    out, taken = runs["out"], runs["names"]["fsdp2"]
    before = (out / "logs" / taken / "metrics.jsonl").read_text()
    proc = run_train([*runs["data"], "--run_name", taken, *COMMON], world=1)
    assert proc.returncode != 0
    assert f"--run_name {taken}" in proc.stderr and "already holds" in proc.stderr, proc.stderr[-3000:]
    assert (out / "logs" / taken / "metrics.jsonl").read_text() == before


def _tool(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath(), TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("script, extra", [("generate.py", ["a small", "--max_new_tokens", "4"]),
                                           ("validate_model.py", ["VAL", "--max_length", "32"])])
def test_tools_given_final_model_name_its_run_folders(runs, tmp_path, script, extra):
    extra = [runs["val"] if a == "VAL" else a for a in extra]
    final = runs["out"] / "final_model"
    proc = _tool(script, str(final), *extra)
    assert proc.returncode == 1
    assert "sentencepiece" not in proc.stderr and "tiktoken" not in proc.stderr, proc.stderr[-3000:]
    assert "run folders" in proc.stderr
    assert all(name in proc.stderr for name in runs["names"].values()), proc.stderr[-3000:]
    # a folder with one run in it: that run, said so
    only = tmp_path / "final_model"
    name = runs["names"]["fsdp2"]
    shutil.copytree(final / name, only / name)
    proc = _tool(script, str(only), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"using {only / name}" in proc.stderr
    assert proc.stdout.startswith("a small" if script == "generate.py" else "val_loss")
    # and a folder with neither
    proc = _tool(script, str(tmp_path), *extra)
    assert proc.returncode == 1 and "holds no saved model" in proc.stderr, proc.stderr[-3000:]
