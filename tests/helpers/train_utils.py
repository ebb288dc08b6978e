"""Helpers for the training-example tests: small real datasets cut from WordNet and a runner for
examples/fsdp_train.py under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


def wordnet_subset(out_dir: str, n_train: int, n_val: int) -> tuple[str, str]:
    """train.json / val.json with the first documents of the built-in dataset's splits."""
    import make_wordnet_dataset

    if not os.path.isdir(make_wordnet_dataset.WORDNET_DIR):
        pytest.skip("wordnet-base is not installed (apt-get install -y wordnet-base)")
    full = os.path.join(out_dir, "full")
    train_full, val_full = make_wordnet_dataset.build(full)
    import ijson

    paths = []
    for src, n, name in ((train_full, n_train, "train.json"), (val_full, n_val, "val.json")):
        with open(src, "rb") as f:
            docs = [d for _, d in zip(range(n), ijson.items(f, "item"))]
        path = os.path.join(out_dir, name)
        make_wordnet_dataset.write_array(path, docs)
        paths.append(path)
    return paths[0], paths[1]


def run_train(args: list[str], world: int = 2, timeout: float = 240.0,
              script: str = os.path.join(EXAMPLES, "fsdp_train.py")) -> subprocess.CompletedProcess:
    """examples/fsdp_train.py (or `script`, which runs it) on `world` CPU ranks (torchrun),
    importing the fsdpcomp the tests use."""
    env = dict(os.environ, PYTHONPATH=pythonpath(),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
           "--standalone", script, *args] if world > 1 else [sys.executable, script, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
