"""random-k's selection sampling as the CUDA kernels run it (csrc/common/fc_randk_par.h: segments from
windows of entry values, composed in two levels, with an exact fallback) equals m_randomk.c's
sequential loop pick for pick: the header's steps run in order by a C harness
(tests/core/host_rules/randk_parallel.c) over sizes, densities, seeds, and windows too narrow to hold
the exact value (every fallback path)."""
import os
import shutil
import subprocess
import sysconfig
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CC = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"


@pytest.fixture(scope="module")
def harness():
    cc = shutil.which(CC.split()[0])
    if cc is None:
        pytest.skip(f"no C compiler ({CC})")
    exe = os.path.join(tempfile.mkdtemp(), "randk_parallel")
    subprocess.run([cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
                    "-I", os.path.join(ROOT, "csrc"), os.path.join(HERE, "host_rules", "randk_parallel.c"),
                    "-o", exe, "-lm"], check=True)
    return exe


def run(exe, cases):
    args = [str(v) for case in cases for v in case]
    r = subprocess.run([exe] + args, capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == len(cases), r.stdout + r.stderr
    return lines


@pytest.mark.parametrize("spread", [6.0, 1.0, 0.0])
def test_segmented_picks_equal_the_sequential_ones(harness, spread):
    cases = [(n, k, seed, spread) for seed in (1, 2)
             for n, k in ((1, 1), (7, 3), (513, 512), (1000, 10), (32768 * 3 + 5, 1000), (100003, 99000),
                          (262144, 1), (262147, 26215), (600000, 300000), (65536, 65536))]
    for line in run(harness, cases):
        assert line.startswith("ok "), line


def test_windows_make_most_segments_usable(harness):
    """At 6 standard deviations nearly every segment's window holds the exact entry value, so
    the fallback (simulating the segment) stays rare: the parallel form's speed."""
    for line in run(harness, [(3000000, 30000, 7, 6.0), (4000000, 400000, 8, 6.0)]):
        f = line.split()
        u1, s1 = map(int, f[4].split("/"))
        u2, s2 = map(int, f[6].split("/"))
        assert u1 >= 0.95 * s1 and u2 >= 0.85 * s2, line
