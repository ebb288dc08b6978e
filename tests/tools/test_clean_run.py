"""README's main command, through examples/run_training.sh as a user runs it, prints no warning
(was: torchrun's OMP_NUM_THREADS banner and transformers' loss_type warning on every rank)."""
import os
import subprocess
import sys

import pytest

from helpers.pkg_path import pythonpath
from helpers.train_utils import EXAMPLES, read_jsonl, wordnet_subset

pytestmark = pytest.mark.slow


def test_readme_command_prints_no_warning(tmp_path):
    train, val = wordnet_subset(str(tmp_path / "data"), 600, 60)
    bindir = tmp_path / "bin"  # the wrapper calls `python`: make it this interpreter
    bindir.mkdir()
    os.symlink(sys.executable, bindir / "python")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=pythonpath(), NPROC="2", PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    cmd = ["bash", os.path.join(EXAMPLES, "run_training.sh"), "--model", "tiny", "--max_steps", "6",
           "--eval_every", "3", "--comm_compress", "int8", "--comm_config_json",
           '{"block_size": 256, "error_feedback": true}', "--data_path", train, "--val_path", val,
           "--batch_size", "4", "--max_length", "32", "--eval_batches", "2", "--output_dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (proc.stdout + proc.stderr).replace("\r", "\n").splitlines()
    noisy = [line for line in lines if "warn" in line.lower() or "OMP_NUM_THREADS" in line or "****" in line]
    assert not noisy, noisy
    assert read_jsonl(str(tmp_path / "out" / "results.jsonl"))[-1]["val_ppl"] > 0
