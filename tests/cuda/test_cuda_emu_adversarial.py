"""The emulation of tests/cuda_emu looks for trouble (cuda_runtime.h's header): a probe program
(tests/cuda_emu/adversarial_probe.cu) built against it shows each adversarial behaviour, so an
emulator that quietly went back to zeroed shared memory, index order, unchecked launches or
synchronous copies fails here, not in silence."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda_emu")
sys.path.insert(0, HERE)
import build as emu_build  # noqa: E402

CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the CUDA emulation")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    with open(os.path.join(HERE, "adversarial_probe.cu")) as f:
        src = emu_build.rewrite(f.read())
    (d / "probe.cpp").write_text(src)
    exe = str(d / "probe")
    subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", "-I", HERE, str(d / "probe.cpp"),
                    os.path.join(HERE, "emu_swap.cpp"), "-o", exe], check=True, capture_output=True, text=True)

    def run(**env):
        r = subprocess.run([exe], capture_output=True, text=True, env=dict(os.environ, **env), timeout=60)
        assert r.returncode == 0, r.stderr
        return dict(line.split(" ", 1) for line in r.stdout.splitlines())
    return run


def test_shared_memory_is_poisoned_before_every_block(probe):
    assert probe()["shared"] == "ffffffff ffffffff ffffffff ffffffff"
    assert probe(FC_EMU_POISON="0x5a")["shared"] == "5a5a5a5a 5a5a5a5a 5a5a5a5a 5a5a5a5a"


def test_threads_arrive_in_a_seeded_random_order(probe):
    """Another seed, another order of the threads and blocks (and the same seed, the same one);
    with FC_EMU_ORDER=index the scheduler's fixed order, whatever the seed."""
    one, seven = probe()["order"], probe(FC_EMU_SEED="7")["order"]
    assert one != seven and probe()["order"] == one
    assert sorted(map(int, one.split())) == list(range(256))
    assert probe(FC_EMU_ORDER="index")["order"] == probe(FC_EMU_ORDER="index", FC_EMU_SEED="7")["order"]


def test_launches_cuda_refuses_do_not_run_and_are_reported(probe):
    out = probe()
    assert out["bad"] == "block: ran 0 peek cudaErrorInvalidConfiguration get cudaErrorInvalidConfiguration after cudaSuccess"
    assert out["empty"] == "grid: ran 0 cudaErrorInvalidConfiguration"
    assert out["big"] == "smem: ran 0 cudaErrorInvalidConfiguration"


def test_a_device_to_host_copy_lands_at_the_hosts_wait(probe):
    assert probe()["copy:"] == "before sync -1 after 42"
