"""tests/gpu/run.sh before a GPU ever runs it: the whole script under the emulated CUDA library
(run.sh --emulated: prerequisites, the emulated build, the pytest group's collection, the bytes
checks at small sizes, sanitize_run.py's calls, what needs the hardware recorded as skipped),
and its pieces on their own: bit comparison that tells NaN payloads apart, the harness's group
budget and per-check records, the example's data large enough for its validation split."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
sys.path[:0] = [os.path.join(TESTS, "gpu"), os.path.join(ROOT, "examples")]

import gpu_common  # noqa: E402
import harness  # noqa: E402

needs_cxx = pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")),
                               reason="no C++ compiler for the CUDA emulation")


@needs_cxx
def test_run_sh_emulated(tmp_path):
    """Every group run.sh has, emulated: each check recorded, the byte checks passing, nothing
    that needs a GPU claiming to have passed."""
    from helpers.pkg_path import pythonpath

    out = tmp_path / "gpu"
    env = dict(os.environ, FSDPCOMP_GPU_OUT=str(out), FSDPCOMP_GPU_GROUP_TIMEOUT="900", PYTHONPATH=pythonpath(),
               # the emulated library the *_emulated.py tests build (pytest_emulated.py's default)
               FSDPCOMP_EMU_DIR=os.environ.get("FSDPCOMP_EMU_DIR") or
               os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}"))
    r = subprocess.run(["bash", os.path.join(ROOT, "tests", "gpu", "run.sh"), "--emulated", "all"],
                       capture_output=True, text=True, env=env, timeout=1800)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    checks = json.loads((out / "summary.json").read_text())["checks"]
    status = {k: v["status"] for k, v in checks.items()}
    for name in ("env.prereq", "build.build", "pytest.cuda_tests", "bytes.encode_bytes_and_residuals",
                 "bytes.encode_nonfinite_bytes", "bytes.loopback_decode_of_w_payloads",
                 "bytes.compress_decompress_single_payloads", "sanitize.entry_points_emulated"):
        assert status.get(name) == "passed", (name, checks.get(name), log[-3000:])
    assert status["bytes.encode_above_2_31_bytes"] == "skipped"
    hardware = [k for k in status if k.split(".")[0] in ("driver", "train", "bench")] + \
        [f"sanitize.{t}" for t in ("memcheck", "initcheck", "racecheck", "synccheck")]
    assert len(hardware) >= 14, status
    for name in hardware:
        assert status[name] == "skipped" and "GPU" in checks[name]["reason"], (name, checks[name])
    # the pytest group: every CUDA test file but the emulator's wrappers
    line = next(ln for ln in log.splitlines() if ln.startswith("---- pytest "))
    for f in ("test_cuda.py", "test_cuda_single.py", "test_cuda_sparse.py", "test_cuda_param_gather.py"):
        assert f"tests/cuda/{f}" in line, line
    assert "_emulated.py" not in line and "test_cuda_emu_" not in line


def test_same_bits_tells_nan_payloads_and_signed_zeros_apart():
    a = torch.tensor([1.0, float("nan"), 0.0])
    b = a.clone()
    assert gpu_common.same_bits(a, b)
    b.view(torch.int32)[1] = 0x7FC00001  # another NaN
    assert not gpu_common.same_bits(a, b) and gpu_common.first_diff(a, b) == 1
    c = a.clone()
    c[2] = -0.0
    assert not gpu_common.same_bits(a, c) and gpu_common.first_diff(a, c) == 2
    h = torch.tensor([float("nan")], dtype=torch.bfloat16)
    h2 = h.clone()
    h2.view(torch.int16)[0] = 0x7FC1
    assert not gpu_common.same_bits(h, h2)
    assert not gpu_common.same_bits(a, a[:2])


def test_harness_records_each_check_as_it_ends_and_keeps_to_its_budget(tmp_path, monkeypatch):
    """A group whose second check outlives the budget: the first's result is in summary.json, the
    second fails on its limit, the third is recorded as not run."""
    (tmp_path / "fake_checks.py").write_text(textwrap.dedent("""
        import time
        def check_quick():
            return {"ok": 1}
        def check_slow():
            time.sleep(120)
        def check_never():
            return {}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.path.join(TESTS, "gpu"), TESTS]))
    monkeypatch.setitem(harness.GROUPS, "fake", ("fake_checks", 300))
    out = tmp_path / "out"
    out.mkdir()
    assert harness.run_group("fake", str(out), [], budget=15) == 1
    checks = json.loads((out / "summary.json").read_text())["checks"]
    assert checks["fake.quick"]["status"] == "passed"
    assert checks["fake.slow"]["status"] == "failed" and "limit" in checks["fake.slow"]["error"]
    assert checks["fake.never"]["status"] == "failed" and "not run" in checks["fake.never"]["error"]


def test_fsdp_train_data_has_both_sides_of_the_validation_split(tmp_path):
    import checks_train
    import textdata

    path = str(tmp_path / "train.txt")
    checks_train.write_text_data(path)
    docs = list(textdata.iter_documents(path))
    assert len(docs) == 3000 and len(set(docs)) == 3000
    val = sum(textdata.held_out(d, 0.05) for d in docs)
    assert 60 < val < 300, val  # fsdp_train.py's default 5%: both sides have documents


def test_werror_switch(monkeypatch):
    """FSDPCOMP_WERROR=0 (run.sh's default on the GPU machine, whose gcc may warn where CI's
    does not) drops -Werror from the C flags; unset, CI's build keeps it."""
    path = os.path.join(ROOT, "setup.py")
    src = open(path).read().split("\next = Extension(")[0]
    ns = {"__file__": path, "__name__": "fsdpcomp_setup_flags"}
    exec(compile(src, path, "exec"), ns)
    monkeypatch.delenv("FSDPCOMP_WERROR", raising=False)
    assert "-Werror" in ns["c_flags"]()
    monkeypatch.setenv("FSDPCOMP_WERROR", "0")
    assert "-Werror" not in ns["c_flags"]()
    text = open(path).read()  # nvcc's flags follow the same switch
    assert '["-Werror", "all-warnings"] if env_flag("FSDPCOMP_WERROR", "1")' in text
