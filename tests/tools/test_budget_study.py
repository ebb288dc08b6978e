# benchmarks/budget_study.py end to end at 4 steps: the per-weight choice it reports fits each budget and is no worse than any single codec that fits.
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY = os.path.join(REPO, "benchmarks", "budget_study.py")


def test_the_choice_fits_the_budget_and_beats_every_single_codec_that_fits(tmp_path):
    out = tmp_path / "study.json"
    proc = subprocess.run([sys.executable, STUDY, "--steps", "4", "--sample_at", "2", "4", "--ratios", "8", "32",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    for ratio in ("8", "32"):
        cell = data["ratios"][ratio]
        lgreco = cell["l-greco"]
        assert lgreco["bytes"] <= cell["budget"]
        assert len(lgreco["choice"]) == 28  # the tiny model's weights (wte tied with the head)
        for single in cell["singles"]:  # the knapsack's optimum includes "every weight alike"
            assert lgreco["err"] <= single["err"] * (1 + 1e-9) + 1e-12
            assert cell["per-param"]["per_param_err"] <= single["per_param_err"] * (1 + 1e-9) + 1e-12
    assert "| 32x | choice, l-greco objective |" in proc.stdout
