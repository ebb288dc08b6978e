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


def test_the_budget_simulation_trains_within_its_budget_after_the_first_choice(tmp_path):
    """benchmarks/budget_sim.py on 2 DDP ranks, 5 steps, the choice remade every 2: step 0 goes
    exact (its measurement is the first), every later step sends at most bytes / 32."""
    env = dict(os.environ, BUDGET_SIM_OUT=str(tmp_path / "sim"))
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "train_bench.py"), "--setting", "cpu", "--link", "unshaped",
         "--seeds", "0", "--max_steps", "5", "--eval_every", "5", "--tag", "sim", "--out_dir", str(tmp_path),
         "--curves_dir", str(tmp_path), "--train_script", os.path.join(REPO, "benchmarks", "budget_sim.py"),
         "--methods", 'none:{"sim": "budget", "sim_ratio": 32, "sim_every": 2}', "--", "--parallel", "ddp"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = (tmp_path / "sim").glob("budget_sim_*.json")
    sim = json.loads(path.read_text())
    per_step = sim["sent_per_step"]
    assert len(per_step) == 5
    assert per_step[0] > 30 * sim["budget_per_step"]  # exact: fp32 bytes
    assert all(0 < b <= sim["budget_per_step"] for b in per_step[1:])
    assert [c["step"] for c in sim["choices"]] == [1, 3]
