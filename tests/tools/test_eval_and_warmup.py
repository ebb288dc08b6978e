"""What a short run's results.jsonl line says about itself (issue 31). val_ppl covers the whole
validation split by default (it came from 8 batches per rank, and validate_model.py on the same
split gave another number), and the line says how many tokens it used (val_tokens, val_batches);
--eval_batches still limits it. A powersgd run whose steps went exact in its warm-up
(start_iter) says how many: warmup_steps_exact in the counters, the results line and the run's
last log line (5 steps of the default start_iter 10 gave ratio 0.9997, silently); a method
without a warm-up says 0."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath
from helpers.train_utils import EXAMPLES, read_jsonl, run_train, wordnet_subset

pytestmark = pytest.mark.slow
MAX_LENGTH, BATCH, WORLD = 32, 4, 2
COMMON = ["--model", "tiny", "--batch_size", str(BATCH), "--max_length", str(MAX_LENGTH),
          "--warmup_steps_discard", "1", "--max_steps", "4", "--seed", "2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("evalwarm")
    train, val = wordnet_subset(str(base / "data"), 600, 60)
    return base, train, val


def _val_blocks(base) -> int:
    """Blocks of the validation cache the runs built (documents joined by EOS, cut into
    max_length-token blocks): read from the cache, not from the code under test."""
    caches = [d for d in (base / "data" / "cache").iterdir() if d.name.startswith(f"val-L{MAX_LENGTH}-")]
    assert len(caches) == 1, caches
    return json.loads((caches[0] / "meta.json").read_text())["num_blocks"]


def _run(data, name: str, *args: str) -> dict:
    """A 4-step run into <base>/<name>: its folder, process, results line and last log line."""
    base, train, val = data
    out = base / name
    proc = run_train(["--data_path", train, "--val_path", val, "--output_dir", str(out), "--run_name", name,
                      *args, *COMMON])
    assert proc.returncode == 0, proc.stderr[-6000:]
    last = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()][-1]
    return {"out": out, "row": read_jsonl(str(out / "results.jsonl"))[-1], "last": last, "val": val}


@pytest.fixture(scope="module")
def powersgd(data):
    """powersgd with start_iter 2 over 4 steps, evaluated on the whole validation split."""
    run = _run(data, "psgd", "--comm_compress", "powersgd", "--comm_config_json", '{"start_iter": 2}')
    return dict(run, blocks=_val_blocks(data[0]))


def test_val_ppl_covers_the_whole_split(powersgd):
    r, blocks = powersgd["row"], powersgd["blocks"]
    assert blocks % (BATCH * WORLD), "a split of whole rounds would not test the last, partial one"
    assert r["val_tokens"] == blocks * (MAX_LENGTH - 1)  # the first token of a block has no target
    assert r["val_batches"] == math.ceil(blocks / (BATCH * WORLD))
    # validate_model.py on the saved model and the same file: the same tokens, the same loss
    env = dict(os.environ, PYTHONPATH=pythonpath(), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "validate_model.py"),
                           str(powersgd["out"] / "final_model" / "psgd"), powersgd["val"],
                           "--max_length", str(MAX_LENGTH)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"val_loss (\S+)\s+val_ppl \S+\s+\((\d+) tokens\)", proc.stdout)
    assert m, proc.stdout
    assert int(m.group(2)) == r["val_tokens"]
    assert float(m.group(1)) == pytest.approx(r["val_loss"], abs=1e-4)  # it prints 4 decimals


def test_powersgd_warmup_is_reported(powersgd):
    r, out = powersgd["row"], powersgd["out"]
    assert r["warmup_steps_exact"] == 2 and r["compress_method"] == "powersgd"
    assert r["warmup_calls_exact"] > 0
    for rank in range(WORLD):
        c = json.loads((out / "logs" / "psgd" / f"counters_rank{rank}.json").read_text())
        assert c["warmup_steps_exact"] == 2
    last = powersgd["last"]
    assert "appended to" in last and "2 of 4 steps sent exact" in last and "start_iter" in last, last


def test_no_warmup_and_eval_batches_override(data):
    run = _run(data, "int8", "--comm_compress", "int8", "--eval_batches", "1")
    r = run["row"]
    assert r["warmup_steps_exact"] == 0 and r["warmup_calls_exact"] == 0
    assert r["val_batches"] == 1 and r["val_tokens"] == BATCH * WORLD * (MAX_LENGTH - 1)
    c = json.loads((run["out"] / "logs" / "int8" / "counters_rank0.json").read_text())
    assert c["warmup_steps_exact"] == 0
    assert "appended to" in run["last"] and "sent exact" not in run["last"], run["last"]
