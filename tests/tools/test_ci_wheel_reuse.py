"""README's command 2 (.ci/run) reuses the wheel command 1 (.ci/setup) built: .ci/wheel keeps a
wheel in dist/ whose stamp (the sources it was built from, setup.py's switches) matches, and
builds when a source or a switch changed. Run in a scratch copy of the tree, with a stand-in
wheel: a real build takes minutes (tests/tools/test_wheel.py checks the real one)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from helpers.clean_tree import copy_clean_tree



@pytest.fixture()
def tree(tmp_path):
    copy_clean_tree(tmp_path, "setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "csrc", "cuda",
                    "fsdpcomp", ".ci")
    return tmp_path


def _wheel(tree, *args, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("FSDPCOMP_CUDA_ARCHS", "FSDPCOMP_REBUILD")}
    e.update(env)
    return subprocess.run(["bash", str(tree / ".ci" / "wheel"), *args], cwd=tree, capture_output=True, text=True,
                          env=e, timeout=120)


def test_a_wheel_of_the_same_sources_and_settings_is_reused(tree):
    stamp = _wheel(tree, "--stamp", FSDPCOMP_CUDA_ARCHS="90")
    assert stamp.returncode == 0 and '"sources"' in stamp.stdout, stamp.stderr
    (tree / "dist").mkdir()
    whl = tree / "dist" / "fsdpcomp-0.1.0-cp310-abi3-manylinux_2_34_x86_64.whl"
    whl.write_bytes(b"stand-in")
    (tree / "dist" / "fsdpcomp-build.json").write_text(stamp.stdout)
    t0 = time.time()
    r = _wheel(tree, FSDPCOMP_CUDA_ARCHS="90")
    assert r.returncode == 0 and "wheel: reusing" in r.stdout, r.stdout + r.stderr
    assert whl.read_bytes() == b"stand-in" and time.time() - t0 < 60  # not rebuilt


def test_another_source_or_setting_changes_the_stamp(tree):
    base = _wheel(tree, "--stamp", FSDPCOMP_CUDA_ARCHS="90").stdout
    assert _wheel(tree, "--stamp", FSDPCOMP_CUDA_ARCHS="75;80;86;90;100;120").stdout != base
    with open(tree / "csrc" / "driver" / "fc_drive.c", "a") as f:
        f.write("/* changed */\n")
    assert _wheel(tree, "--stamp", FSDPCOMP_CUDA_ARCHS="90").stdout != base
