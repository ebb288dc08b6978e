"""fsdpcomp.results: combining rank counters, building a line (null where unmeasured) and
appending whole lines from concurrent writers."""
from __future__ import annotations

import json
import math
import multiprocessing as mp

import pytest
import torch

import fsdpcomp
from fsdpcomp.results import REQUIRED_FIELDS, append_result, build_record, combine_counters, read_results

RUN = {"run_name": "r", "world_size": 2, "model": "tiny", "dataset": "d", "max_length": 8, "batch_size": 2,
       "compress_method": "int8", "compress_config": {}, "seed": 0, "train_loss": 3.0, "val_loss": None,
       "val_ppl": None}


def _real_counters(gen):
    """Counters of a real int8 state after compressing random gradients as one of 2 ranks."""
    state = fsdpcomp.CommState("int8", {"block_size": 64, "compress_own_chunk": True, "error_stats_every": 1})
    out = torch.empty(512)
    for _ in range(3):
        state.reduce_scatter(torch.randn(512, generator=gen), out)
        state.end_step()
    return state.counters()


def test_combine_sums_bytes_and_averages_times(gen):
    a, b = _real_counters(gen), _real_counters(gen)
    c = combine_counters([a, b])
    assert c["bytes_raw"] == a["bytes_raw"] + b["bytes_raw"] > 0
    assert c["bytes_compressed"] == a["bytes_compressed"] + b["bytes_compressed"]
    assert c["compress_time_s"] == pytest.approx((a["compress_time_s"] + b["compress_time_s"]) / 2)
    assert c["ratio"] == pytest.approx(c["bytes_raw"] / c["bytes_compressed"]) and c["ratio"] > 1
    with pytest.raises(ValueError, match="at least one rank"):
        combine_counters([])


def test_record_has_every_field_and_nulls_unmeasured(gen):
    c = combine_counters([_real_counters(gen)])
    rec = build_record(run=RUN, step_times_s=[0.1, 0.2, 0.3], tokens_per_step=32, counters=c)
    assert all(k in rec for k in REQUIRED_FIELDS)
    assert rec["step_time_ms_mean"] == pytest.approx(200.0) and rec["step_time_ms_p50"] == pytest.approx(200.0)
    assert rec["step_time_ms_p90"] == pytest.approx(280.0)
    assert rec["tokens_per_s"] == pytest.approx(32 * 3 / 0.6)
    assert rec["comm_time_ms_by_op"]["all_gather"] is None and rec["mem_peak_alloc_gb"] is None
    assert rec["val_ppl"] is None and rec["compression_ratio"] == pytest.approx(c["ratio"])
    nan_run = dict(RUN, train_loss=float("nan"))
    assert build_record(run=nan_run, step_times_s=[], tokens_per_step=1, counters=c)["train_loss"] is None
    with pytest.raises(ValueError, match="missing seed"):
        build_record(run={k: v for k, v in RUN.items() if k != "seed"}, step_times_s=[], tokens_per_step=1,
                     counters=c)


def _writer(path, i, n):
    for j in range(n):
        append_result(path, {"writer": i, "j": j, "pad": "x" * (1000 + 37 * i)})


def test_concurrent_appends_keep_whole_lines(tmp_path):
    path = str(tmp_path / "sub" / "results.jsonl")
    ctx = mp.get_context("fork")  # the writers only do file I/O: no re-import of torch
    procs = [ctx.Process(target=_writer, args=(path, i, 50)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = read_results(path)
    assert len(rows) == 200
    assert sorted((r["writer"], r["j"]) for r in rows) == [(i, j) for i in range(4) for j in range(50)]


def test_read_results_names_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n{broken\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_results(str(path))
    line = append_result(str(tmp_path / "ok.jsonl"), {"x": math.pi})
    assert line.endswith("\n") and json.loads(line)["x"] == math.pi


def test_adaptive_choice_reaches_the_results_line():
    """adaptive's counters (its parts tables: the same on every rank) pass through combine_counters
    into the record as rank 0's; other methods' records have no such field."""
    choice = {"chosen_at_step": 50, "choose_time_s": 0.1,
              "parts": [{"unit": 0, "start": 0, "end": 10, "codec": "int8", "bytes": 20, "err_sq": 0.5}]}
    per_rank = [{"method": "adaptive", "bytes_raw": 80, "bytes_compressed": 20, "adaptive": choice},
                {"method": "adaptive", "bytes_raw": 80, "bytes_compressed": 20, "adaptive": choice}]
    combined = combine_counters(per_rank)
    assert combined["adaptive"] == choice
    assert "adaptive" not in combine_counters([{"method": "int8", "bytes_raw": 8, "bytes_compressed": 2}])
