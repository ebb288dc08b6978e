"""benchmarks/kernels.py validates every method before timing and writes its JSON (small size)."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load():
    spec = importlib.util.spec_from_file_location("kernels", os.path.join(ROOT, "benchmarks", "kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernels_benchmark_validates_and_writes_json(tmp_path, capsys):
    k = load()
    path = tmp_path / "k.json"
    assert k.main(["--max-size", "64K", "--reps", "1", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["label"] for r in rows} == set(k.CONFIGS)
    assert all(r["wrong"] == 0 and r["n"] == 65536 and r["memcpy_gbs"] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "enc/cpy" in out and "#wrong" in out


def test_a_wrong_result_fails_the_run(monkeypatch):
    k = load()
    monkeypatch.setattr(k.CpuBackend, "decode", lambda self, s, p, acc: acc.add_(1.0))
    assert k.main(["--max-size", "64K", "--reps", "1", "--methods", "int8"]) == 1
