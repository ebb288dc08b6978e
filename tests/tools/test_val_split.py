"""Training on the user's own data without --val_path: a deterministic held-out validation split
(--val_fraction), so results.jsonl always has val_loss/val_ppl; and what else an ordinary CPU
run now measures (peak RSS, FSDP's all-gather time), with no warning on stderr."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from helpers.train_utils import read_jsonl, run_train, wordnet_subset
import textdata


def _byte_encode(texts):
    return [list(t.encode("utf-8")) for t in texts]


def test_split_is_disjoint_complete_and_deterministic(tmp_path, gen):
    words = ["gradient", "shard", "rank", "token", "block", "scale", "residual", "error", "byte", "wire"]
    docs = [{"id": str(i), "title": f"doc {i}",
             "text": " ".join(words[int(j)] for j in torch_randint(gen, len(words), 5 + i % 30))}
            for i in range(400)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    texts = list(textdata.iter_documents(str(path)))
    val = [t for t in texts if textdata.held_out(t, 0.1)]
    assert 20 <= len(val) <= 60  # about a tenth of 400
    assert val == [t for t in texts if textdata.held_out(t, 0.1)]  # a pure function of the text
    assert not any(textdata.held_out(t, 0.0) for t in texts)
    # the two caches take complementary documents of the one file
    metas = {}
    for side, keep in (("train", lambda t: not textdata.held_out(t, 0.1)),
                       ("val", lambda t: textdata.held_out(t, 0.1))):
        cdir = textdata.cache_dir_for(str(tmp_path), str(path), "tok", 16, textdata.split_part(0.1, side))
        metas[side] = textdata.build_cache(str(path), cdir, _byte_encode, 256, 16, shard_docs=50, keep=keep)
        metas[side]["dir"] = cdir
    assert metas["train"]["dir"] != metas["val"]["dir"]
    assert metas["val"]["kept_samples"] == len(val)
    assert metas["train"]["kept_samples"] + metas["val"]["kept_samples"] == len(texts)
    assert metas["train"]["processed_samples"] == metas["val"]["processed_samples"] == len(texts)
    val_tokens = np.concatenate([np.load(f"{metas['val']['dir']}/{s['file']}").ravel()
                                 for s in metas["val"]["shards"]])
    joined = [b for t in val for b in list(t.encode()) + [256]]
    assert val_tokens.tolist() == joined[:len(val_tokens)]  # the held-out documents, in file order


def torch_randint(gen, high, n):
    import torch
    return torch.randint(0, high, (n,), generator=gen).tolist()


COMMON = ["--model", "tiny", "--batch_size", "4", "--max_length", "32", "--eval_batches", "2",
          "--warmup_steps_discard", "1", "--max_steps", "4", "--comm_compress", "int8",
          "--comm_config_json", '{"num_bits": 8}']


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    base = tmp_path_factory.mktemp("userdata")
    train, _ = wordnet_subset(str(base / "data"), 1200, 10)
    return base, train


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp1", "fsdp2", "ddp"])
def test_own_data_without_val_path_fills_every_field(user_data, parallel):
    base, train = user_data
    out = base / f"out-{parallel}"
    proc = run_train(["--data_path", train, "--output_dir", str(out), "--parallel", parallel, *COMMON])
    assert proc.returncode == 0, proc.stderr[-6000:]
    # a clean run prints no warning (tqdm's bar and the log lines are all there is)
    noise = [line for line in proc.stderr.replace("\r", "\n").splitlines() if "warn" in line.lower()]
    assert not noise, noise
    r = read_jsonl(str(out / "results.jsonl"))[-1]
    assert r["val_fraction"] == 0.05 and r["val_dataset"] == "0.05 of train.json (held out)"
    assert math.isfinite(r["val_loss"]) and r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
    # CPU memory: the ranks' peak RSS (a process with torch loaded holds well over 100 MB)
    assert 0.1 < r["mem_peak_alloc_gb"] < 16 and r["mem_peak_source"] == "peak RSS, max over ranks"
    assert r["mem_peak_reserved_gb"] is None
    by_op = r["comm_time_ms_by_op"]
    if parallel == "ddp":
        assert by_op["all_gather"] == 0.0  # DDP gathers no parameters
    else:
        assert by_op["all_gather"] > 0  # FSDP's parameter all-gathers, timed without the profiler
    assert r["comm_time_ms_total"] == pytest.approx(by_op["all_gather"] + by_op["all_to_all"]
                                                    + r["extra_collective_time_ms"])


def test_val_fraction_is_checked(user_data):
    base, train = user_data
    for args, message in ((["--data_path", train, "--val_fraction", "1.5"], "--val_fraction must be in [0, 1)"),
                          (["--data_path", train, "--val_fraction", "0.1", "--val_path", train],
                           "does not combine with --val_path"),
                          (["--val_fraction", "0.1"], "the built-in data")):
        proc = run_train([*args, "--output_dir", str(base / "bad"), "--max_steps", "5"], world=1)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    # a split too small for one validation batch is refused before training, with the way out
    proc = run_train(["--data_path", train, "--val_fraction", "1e-9", "--output_dir", str(base / "small"),
                      *COMMON], world=1)
    assert proc.returncode != 0
    assert "raise it, or pass --val_path" in proc.stderr or "raise --val_fraction, or pass --val_path" in proc.stderr, \
        proc.stderr[-2000:]
