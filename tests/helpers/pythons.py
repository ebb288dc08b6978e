"""The other CPython interpreters on this machine, and a probe that loads fsdpcomp's _C file in
one of them without torch: the checks that one stable-ABI build (tests/tools/test_abi3.py) and one
cp310-abi3 wheel (tests/tools/test_wheel.py) serve every CPython >= 3.10."""
import glob
import os
import shutil
import subprocess
import sys

# Runs in another interpreter without torch: load the file as fsdpcomp._C and exercise what
# needs no tensor (a State's lifetime and GC, a config error naming the type it got).
ABI3_PROBE = r"""
import gc, importlib.util, sys
spec = importlib.util.spec_from_file_location("fsdpcomp._C", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
s = m.State("int8", {"block_size": 64})
assert s.method == "int8" and s.config["block_size"] == 64, s.config
try:
    m.State("int8", {"block_size": 1.5})
    raise SystemExit("a float block_size was accepted")
except ValueError as e:
    assert "must be an integer, got float" in str(e), e
fp = s.fingerprint
del s
gc.collect()
print("%d.%d" % sys.version_info[:2], len(m.methods()), fp)
"""


def other_cpythons() -> dict[tuple[int, int], str]:
    """{minor: executable} of the CPython >= 3.10 interpreters on PATH or under pyenv, this one
    excluded."""
    cands = [shutil.which(f"python3.{n}") for n in range(10, 20)]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    cands += sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
    found = {}
    for exe in filter(None, cands):
        try:
            r = subprocess.run([exe, "-c", "import sys; print(sys.implementation.name, *sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        parts = r.stdout.split()
        if r.returncode == 0 and len(parts) == 3 and parts[0] == "cpython":
            minor = (int(parts[1]), int(parts[2]))
            if minor >= (3, 10) and minor != sys.version_info[:2]:
                found.setdefault(minor, exe)
    return found
