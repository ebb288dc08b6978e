"""tests/gpu/run.sh before a GPU ever runs it: `prepare`'s folder restored into a clean tree and
both profiles run there on the emulated CUDA library (run.sh --emulated quick rest: the carried
libraries verified, every check recorded, the byte checks passing, what needs the hardware
recorded as skipped), carried libraries of other sources or another ABI refused, and the pieces
on their own: bit comparison that tells NaN payloads apart, the harness's group budget and
per-check records, the example's data large enough for its validation split."""
from __future__ import annotations

import json
import os
import re
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
from helpers.clean_tree import copy_clean_tree  # noqa: E402
import harness  # noqa: E402

needs_cxx = pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")),
                               reason="no C++ compiler for the CUDA emulation")


needs_nvcc = pytest.mark.skipif(not (os.environ.get("NVCC") or shutil.which("nvcc") or
                                     os.path.exists("/usr/local/cuda/bin/nvcc")),
                                 reason="no nvcc: prepare builds the CUDA library")
PREPARE = os.path.join(ROOT, "tests", "gpu", "prepare.py")
# every check the two profiles record, by name: a profile that loses one fails here
QUICK_REST_CHECKS = {
    "env.prereq", "env.carried", "build.build",
    "pytest.cuda_tests_quick", "pytest.cuda_tests_rest",
    "bytes.encode_bytes_and_residuals", "bytes.encode_nonfinite_bytes", "bytes.loopback_decode_of_w_payloads",
    "bytes.compress_decompress_single_payloads", "bytes.encode_above_2_31_bytes",
    "driver.300_calls_without_counters", "driver.comm_time_is_device_time", "driver.counters_wait_without_the_gil",
    "driver.sampled_statistics_follow_the_cpu_rule",
    "train.fsdp1_every_method", "train.fsdp2_every_method", "train.ddp_every_method", "train.step_cost_gpt2_62m",
    "train.examples_fsdp_train",
    "bench.kernels_cuda_quick", "bench.kernels_cuda_rest",
    "sanitize.entry_points_emulated", "sanitize.memcheck", "sanitize.initcheck", "sanitize.racecheck",
    "sanitize.synccheck",
}


def _run_sh(tree, out, *args):
    env = dict(os.environ, FSDPCOMP_GPU_OUT=str(out),
               FSDPCOMP_EMU_DIR=os.environ.get("FSDPCOMP_EMU_DIR") or
               os.path.join(tempfile.gettempdir(), f"fsdpcomp_cuda_emu_{os.getuid()}"))
    env.pop("PYTHONPATH", None)  # the tree's own fsdpcomp, with the carried _C
    return subprocess.run(["bash", os.path.join(tree, "tests", "gpu", "run.sh"), *args], capture_output=True,
                          text=True, env=env, timeout=1800)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """`prepare` (no wheels: no network needed) and its folder restored into a clean tree."""
    tmp = tmp_path_factory.mktemp("prepared")
    built = tmp / "built" / ".gpu"
    # FSDPCOMP_CUDA_ARCHS as CI sets it (the release wheel's list) must not reach prepare's build
    env = dict(os.environ, FSDPCOMP_CUDA_ARCHS="75;80;86;90;100;120")
    r = subprocess.run([sys.executable, PREPARE, "build", "--dir", str(built), "--scratch", str(tmp / "scratch"),
                        "--no-wheels"], capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["archs"] == ["90"] and manifest["ptx"] == "90" and "csrc/driver/fc_drive.c" in manifest["sources"]
    tree = tmp / "tree"
    copy_clean_tree(tree)
    shutil.copytree(built, tree / ".gpu")
    return tree


@needs_cxx
@needs_nvcc
def test_prepared_folder_runs_quick_and_rest_emulated(prepared, tmp_path):
    """The GPU plan as the device will run it, emulated: the carried libraries verified and
    used (nothing compiled but the emulation), every check of both profiles recorded, the byte
    checks passing, nothing that needs a GPU claiming to have passed."""
    out = tmp_path / "gpu"
    r = _run_sh(prepared, out, "--emulated", "quick", "rest")
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    checks = json.loads((out / "summary.json").read_text())["checks"]
    assert set(checks) == QUICK_REST_CHECKS, (set(checks) ^ QUICK_REST_CHECKS, log[-3000:])
    status = {k: v["status"] for k, v in checks.items()}
    for name in ("env.prereq", "env.carried", "build.build", "pytest.cuda_tests_quick", "pytest.cuda_tests_rest",
                 "bytes.encode_bytes_and_residuals", "bytes.encode_nonfinite_bytes",
                 "bytes.loopback_decode_of_w_payloads", "bytes.compress_decompress_single_payloads",
                 "sanitize.entry_points_emulated"):
        assert status[name] == "passed", (name, checks[name], log[-3000:])
    assert checks["env.carried"]["detail"]["sm"] == ["90"]
    assert status["bytes.encode_above_2_31_bytes"] == "skipped"
    hardware = [k for k in status if k.split(".")[0] in ("driver", "train", "bench")] + \
        [f"sanitize.{t}" for t in ("memcheck", "initcheck", "racecheck", "synccheck")]
    for name in hardware:
        assert status[name] == "skipped" and "GPU" in checks[name]["reason"], (name, checks[name])
    # the benchmark's rows are listed per profile: quick every method at two sizes and int8's +ef
    # and +sampled, rest the rest of the full table
    import fsdpcomp
    assert f"({2 * len(fsdpcomp.codecs()) + 2} rows listed)" in checks["bench.kernels_cuda_quick"]["reason"]
    # the kernel table first: its speed is known before the long checks run
    items = [ln.split("== ")[1].split(":")[0] for ln in log.splitlines() if ln.startswith("== ")]
    items = [i for i in items if i.split(".")[0] not in ("env", "build")]
    assert items[0] == "bench.kernels_cuda_quick", items[:5]
    # the pytest sets: quick the device-equals-CPU files, rest the build file
    lines = [ln for ln in log.splitlines() if ln.startswith("---- pytest ")]
    assert "tests/cuda/test_cuda_sparse.py" in lines[0] and "test_cuda_build.py" not in lines[0], lines
    assert "test_cuda_driver.py" not in " ".join(lines) and "tests/cuda/test_cuda_build.py" in lines[1], lines
    assert "---- build (archs" not in log, "the CUDA library was compiled, not carried"


@needs_nvcc
def test_carried_libraries_of_other_sources_or_abi_are_refused(prepared, tmp_path):
    """Refused by name before any check runs: the sources changed since prepare, or the
    checkout's FC_CUDA_ABI is not the one the library answers, or the manifest's archs are not
    the library's."""
    csrc = prepared / "csrc" / "driver" / "fc_drive.c"
    header = prepared / "csrc" / "backend_cuda" / "fc_cuda.h"
    manifest = prepared / ".gpu" / "manifest.json"
    saved = {p: p.read_text() for p in (csrc, header, manifest)}
    try:
        csrc.write_text(saved[csrc] + "\n/* changed after prepare */\n")
        out = tmp_path / "sources"
        r = _run_sh(prepared, out, "--emulated", "quick")
        assert r.returncode == 1, r.stdout[-3000:]
        checks = json.loads((out / "summary.json").read_text())["checks"]
        assert set(checks) == {"env.prereq", "env.carried"}, checks  # nothing else ran
        assert "built from other sources: csrc/driver/fc_drive.c" in checks["env.carried"]["error"]
        csrc.write_text(saved[csrc])

        abi = int(re.search(r"#define FC_CUDA_ABI (\d+)", saved[header]).group(1))
        header.write_text(saved[header].replace(f"#define FC_CUDA_ABI {abi}", f"#define FC_CUDA_ABI {abi + 1}"))
        r = subprocess.run([sys.executable, str(prepared / "tests" / "gpu" / "prepare.py"), "verify", "--emulated"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 3 and f"answers no FC_CUDA_ABI {abi + 1}" in r.stdout, r.stdout + r.stderr
        header.write_text(saved[header])

        m = json.loads(saved[manifest])
        manifest.write_text(json.dumps(dict(m, archs=["80"], ptx="80")))
        r = subprocess.run([sys.executable, str(prepared / "tests" / "gpu" / "prepare.py"), "verify", "--emulated"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 3 and "holds code for sm ['90'] and PTX ['90']" in r.stdout, r.stdout + r.stderr
    finally:
        for p, text in saved.items():
            p.write_text(text)


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
    # 40 s: the first check (a fresh interpreter) must end with >= 10 s left for the second even on a
    # loaded machine (at 15 s, under a load of 8 on 2 cores, the second was never started)
    assert harness.run_group("fake", str(out), [], budget=40) == 1
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


def test_collect_keeps_each_checks_latest_run(tmp_path):
    """tests/gpu/collect.py over two runs: a later result replaces an earlier one, except a
    skip (a profile that left the check out); kernel rows of both runs, the later per row."""
    import collect

    def run(name, checks, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"checks": checks, "updated": name}))
        (d / "env.json").write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11"}))
        (d / "kernels_quick.json").write_text(json.dumps({"device": "NVIDIA H200", "rows": rows}))
        return str(d)

    fails = [{"test": f"t{i}", "error": "x" * 5000} for i in range(50)]
    a = run("a", {"bytes.x": {"status": "passed", "seconds": 1}, "driver.y": {"status": "passed", "seconds": 2},
                  "pytest.z": {"status": "failed", "seconds": 3, "detail": {"failures": fails}}},
            [{"method": "int8", "n": 16, "enc_ms": 1.0}, {"method": "fp8", "n": 16, "enc_ms": 2.0}])
    b = run("b", {"bytes.x": {"status": "skipped", "seconds": 0, "reason": "excluded"},
                  "driver.y": {"status": "failed", "seconds": 2, "error": "broke"}},
            [{"method": "int8", "n": 16, "enc_ms": 0.5}])
    summary, kernels = collect.collect([a, b], ["first", "second"])
    checks = summary["checks"]
    assert checks["bytes.x"]["status"] == "passed" and checks["bytes.x"]["run"] == 0
    assert checks["driver.y"]["status"] == "failed" and checks["driver.y"]["run"] == 1
    kept = checks["pytest.z"]["detail"]["failures"]
    assert len(kept) == collect.KEEP_FAILURES and len(kept[0]["error"]) == collect.KEEP_FAILURE
    assert summary["counts"] == {"passed": 1, "failed": 2} and summary["device"] == "NVIDIA H200"
    assert [r["note"] for r in summary["runs"]] == ["first", "second"]
    assert {(r["method"], r["enc_ms"]) for r in kernels["rows"]} == {("int8", 0.5), ("fp8", 2.0)}
    # each run's record in both files (the projection names the run it uses by it); no carried.json
    # and a note without `main <hex>`: no commit
    assert [(r["run"], r["commit"]) for r in kernels["runs"]] == [(0, None), (1, None)]
    assert kernels["runs"][1]["device"] == "NVIDIA H200" and summary["runs"][1]["commit"] is None


def test_collect_names_each_runs_commit(tmp_path):
    """The commit prepare recorded (carried.json's manifest) wins; else the note's `main <hex>`."""
    import collect

    dirs = []
    for name, carried in (("a", {"manifest": {"commit": "0123456789ab+changes"}}), ("b", None)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"checks": {}, "updated": "2026-12-01T00:00:00"}))
        if carried:
            (d / "carried.json").write_text(json.dumps(carried))
        dirs.append(str(d))
    summary, kernels = collect.collect(dirs, ["quick, main 0badc0de", "rest, main 1234567"])
    assert [r["commit"] for r in summary["runs"]] == ["0123456789ab+changes", "1234567"]
    assert [r["commit"] for r in kernels["runs"]] == ["0123456789ab+changes", "1234567"]


def test_collect_appends_a_run_after_the_collected_ones(tmp_path):
    """--append: a new run lands after what an earlier session collected (its folders gone): run
    numbers continue, its checks replace theirs, kernel rows merge per (method, n)."""
    import collect

    d = tmp_path / "c"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"checks": {"driver.y": {"status": "passed", "seconds": 1}},
                                                "updated": "c"}))
    (d / "kernels_quick.json").write_text(json.dumps({"device": "H200", "rows": [{"method": "int8", "n": 16,
                                                                                  "enc_ms": 0.25}]}))
    earlier = ({"device": "H200", "runs": [{"run": 0, "note": "a"}, {"run": 1, "note": "b"}],
                "checks": {"driver.y": {"status": "failed", "run": 1}, "bytes.x": {"status": "passed", "run": 0}}},
               {"device": "H200", "torch": "2.11", "rows": [{"method": "int8", "n": 16, "enc_ms": 0.5, "run": 1},
                                                            {"method": "fp8", "n": 16, "enc_ms": 2.0, "run": 0}]})
    summary, kernels = collect.collect([str(d)], ["third"], onto=earlier)
    assert [(r["run"], r["note"]) for r in summary["runs"]] == [(0, "a"), (1, "b"), (2, "third")]
    assert summary["checks"]["driver.y"] == {"status": "passed", "seconds": 1, "run": 2}
    assert summary["checks"]["bytes.x"]["run"] == 0 and summary["counts"] == {"passed": 2}
    assert {(r["method"], r["enc_ms"], r["run"]) for r in kernels["rows"]} == {("int8", 0.25, 2), ("fp8", 2.0, 0)}
    assert len(earlier[0]["runs"]) == 2  # the earlier summary is read, not changed
    assert [r["run"] for r in kernels["runs"]] == [0, 1, 2]


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="no gloo")
def test_step_cost_check_runs_on_the_cpu_and_is_shown(tmp_path):
    """checks_train.step_cost, the train group's gpt2-62m step cost, on the CPU (gloo, the tiny
    preset, one warm-up and one timed step): the driven reduce-scatters and gathers run, the
    codec's counters move, and the results page shows what it returns."""
    pytest.importorskip("transformers")
    script = tmp_path / "step_cost.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, socket, sys
        sys.path[:0] = [{os.path.join(TESTS, "gpu")!r}, {TESTS!r}]
        import torch.distributed as dist
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
        import checks_train
        print(json.dumps(checks_train.step_cost("cpu", "tiny", 2, 32, 1, 1)))
        dist.destroy_process_group()
    """))
    from helpers.pkg_path import pythonpath
    r = subprocess.run([sys.executable, "-P", str(script)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=pythonpath()))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    n_modules = 3  # the tiny preset's 2 blocks and the model itself
    assert d["grad_calls_per_step"] == n_modules and d["param_gathers_per_step"] == 2 * n_modules
    for k in ("grad_encode_ms", "grad_decode_ms", "param_encode_ms", "param_decode_ms", "step_ms"):
        assert d[k] > 0, k
    assert d["codec_ms"] == pytest.approx(d["grad_encode_ms"] + d["grad_decode_ms"] + d["param_encode_ms"]
                                          + d["param_decode_ms"])
    assert len(d["losses"]) == 2 and all(v == v for v in d["losses"])
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import results_gpu
    lines = results_gpu._step_lines({"checks": {results_gpu.STEP_CHECK: {"status": "passed", "run": 4, "detail": d}}})
    text = "\n".join(lines)
    assert "tiny (" in text and f"| codec total | {d['codec_ms']:.2f} |" in text and "(run 4)" in text
    missing = results_gpu._step_lines({"checks": {}})
    assert "not run yet" in "\n".join(missing)
