"""train_bench --merge: runs of separate invocations (one per seed, run one after another)
summarised as one, with the command that reproduces them in one invocation."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))
import results_io  # noqa: E402
import train_bench  # noqa: E402


def _invocation(tmp_path, seed, ppl):
    stem = f"train_bench_cpu_s{seed}"
    meta = {"argv": ["benchmarks/train_bench.py", "--seeds", str(seed), "--curves_dir", "/scratch",
                     "--tag", f"s{seed}", "--methods", "int8"],
            "setting": "cpu", "model": "tiny", "world": 2, "max_steps": 10, "batch_size": 8, "max_length": 128}
    (tmp_path / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": []}))
    runs = [{"method": m, "seed": seed, "record": {"val_ppl": v, "compression_ratio": r}, "curve": []}
            for m, v, r in (("none", ppl, 1.0), ("int8", ppl * 1.01, 3.9))]
    results_io.write_curves(str(tmp_path / "curves"), stem, runs)
    return stem


def test_merge_summarises_every_seed_and_reproduces_them_in_one_command(tmp_path):
    stems = [_invocation(tmp_path, s, ppl) for s, ppl in ((0, 100.0), (1, 110.0))]
    assert train_bench.main(["--merge", *stems, "--link", "unshaped", "--out_dir", str(tmp_path),
                             "--curves_dir", str(tmp_path / "curves"), "--tag", "both"]) == 0
    out = json.loads((tmp_path / "train_bench_cpu_both.json").read_text())
    rows = {r["method"]: r for r in out["rows"]}
    assert rows["int8"]["seeds"] == [0, 1] and abs(rows["int8"]["delta_ppl_pct"] - 1.0) < 1e-9
    assert abs(rows["none"]["val_ppl"] - 105.0) < 1e-9 and rows["none"]["val_ppl_std"] > 0
    argv = out["meta"]["argv"]
    assert argv[argv.index("--seeds") + 1:argv.index("--seeds") + 3] == ["0", "1"]
    assert argv[argv.index("--tag") + 1] == "both" and "--curves_dir" not in argv


def test_baseline_takes_none_from_an_earlier_invocation_and_refuses_other_settings(tmp_path):
    """--baseline: `none`'s runs of an earlier invocation stand in for training them again, for the
    seeds asked; another setting or a missing seed is refused by name."""
    stem = _invocation(tmp_path, 1, 120.0)
    common = ["--link", "unshaped", "--out_dir", str(tmp_path), "--curves_dir", str(tmp_path / "curves"),
              "--max_steps", "10", "--baseline", stem]
    # only `none` asked: nothing is trained, the summary is the earlier run's
    assert train_bench.main([*common, "--seeds", "1", "--methods", "none", "--tag", "reuse"]) == 0
    rows = json.loads((tmp_path / "train_bench_cpu_reuse.json").read_text())["rows"]
    assert [(r["method"], r["val_ppl"]) for r in rows] == [("none", 120.0)]
    for extra, named in ((["--seeds", "2"], "seed(s) [2]"), (["--seeds", "1", "--max_steps", "20"], "max_steps")):
        try:
            train_bench.main([*common, *extra, "--methods", "none", "--tag", "bad"])
        except SystemExit as e:
            assert named in str(e), e
        else:
            raise AssertionError(f"{extra} was not refused")
