"""The recipes of docs/recipes.md as a user runs them: examples/recipes/*.py under torchrun on 2
gloo ranks, tiny randomly initialised Hugging Face GPT-2 models built from a config (no
downloads). Each script prints rank 0's losses and its counters table; the checks read those."""
import os
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath

RECIPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "recipes")
STEPS = 8


def _torchrun(name: str, steps: int, nproc: int = 2):
    """The script as a user launches it; returns rank 0's printed losses and counters table."""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                           os.path.join(RECIPES, name + ".py"), "--steps", str(steps)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    losses = [float(x) for x in next(words for words in lines if words[0] == "loss")[1:]]
    table = {words[0]: words[1] for words in lines if len(words) >= 2}
    return losses, table


def _check(losses, table, steps=STEPS):
    assert len(losses) == steps and sum(losses[-2:]) < 0.85 * sum(losses[:2]), losses
    assert float(table["ratio"]) > 3.5 and table["fallback_units"] == "0" and table["nonfinite_in"] == "0"


def test_hf_fsdp2_int8_with_param_gather():
    losses, table = _torchrun("hf_fsdp2", STEPS)
    _check(losses, table)
    assert table["units"] == "3" and table["step"] == str(STEPS)  # 2 blocks + the root
    assert int(table["param_gather_calls"]) > 0
    # int8 weights on the wire: 8 bits + a scale per 256 elements, against fp32
    assert int(table["param_gather_bytes_sent"]) < 0.3 * int(table["param_gather_bytes_raw"])


def test_fsdp1_cpu():
    losses, table = _torchrun("fsdp1_cpu", STEPS)
    _check(losses, table)
    assert table["units"] == "3" and table["step"] == str(STEPS)


def test_accelerate_ddp():
    pytest.importorskip("accelerate")
    losses, table = _torchrun("accelerate_ddp", STEPS)
    _check(losses, table)
    # DDP's first backward goes uncompressed (DDP rebuilds its buckets after it)
    assert table["step"] == str(STEPS - 1)


def test_accelerate_fsdp2_wrapping():
    # accelerate's own FSDP2 wrapping (fsdp2_prepare_model: fully_shard per GPT2Block, the tied
    # embeddings, final norm and lm_head as one group, then the root), on CPU
    pytest.importorskip("accelerate")
    losses, table = _torchrun("accelerate_fsdp", STEPS)
    _check(losses, table)
    # root, 2 blocks, [ln_f, wte, lm_head]: one unit (the group shares one reduce-scatter)
    assert table["units"] == "4" and table["step"] == str(STEPS)
    assert int(table["param_gather_bytes_sent"]) < 0.3 * int(table["param_gather_bytes_raw"])


def test_hybrid_dct_across_nodes():
    # 4 ranks as 2 nodes of 2: exact reduce-scatter inside a node, dct on the replica all-reduce
    losses, table = _torchrun("hybrid_dct", 12, nproc=4)
    assert len(losses) == 12 and sum(losses[-2:]) < 0.85 * sum(losses[:2]), losses
    assert table["method"] == "dct" and float(table["ratio"]) > 30
    assert table["fallback_units"] == "0" and table["nonfinite_in"] == "0"
    assert table["units"] == "3" and table["step"] == "12"  # 2 blocks + the root
