"""The wheel `.ci/wheel` builds (dist/fsdpcomp-*.whl, or $FSDPCOMP_WHEEL): one cp310-abi3
manylinux wheel holding _C.abi3.so, every module of the package and, when nvcc built it, the CUDA
library for every listed arch plus PTX, and nothing it must not vendor (the driver, NCCL, torch,
cudart); it installs and works in a fresh virtual environment with no compiler on PATH."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers.fatbin import fatbin_entries
from helpers.pythons import ABI3_PROBE, other_cpythons

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_NVCC = bool(os.environ.get("NVCC") or shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))
CPU_ONLY_BUILD = os.environ.get("FSDPCOMP_CUDA", "auto").strip().lower() in ("0", "off", "no", "false")
CUDA_LIB = "fsdpcomp/_fsdpcomp_cuda.so"
# Libraries the user's machine or torch provides: a copy in the wheel would clash with theirs.
NOT_VENDORED = re.compile(r"lib(cuda|cudart|nccl|torch|c10|python)[^/]*\.so")
NO_COMPILER = ("gcc", "cc", "c++", "g++", "clang", "nvcc")


@pytest.fixture(scope="module")
def wheel() -> str:
    path = os.environ.get("FSDPCOMP_WHEEL")
    if not path:
        found = sorted(glob.glob(os.path.join(ROOT, "dist", "fsdpcomp-*.whl")), key=os.path.getmtime)
        if not found:
            pytest.skip("no wheel in dist/ (bash .ci/wheel builds it; CI does)")
        path = found[-1]
    assert os.path.isfile(path), path
    return path


def expected_archs() -> list[str]:
    """FSDPCOMP_CUDA_ARCHS as the build read it (.ci/wheel's stamp beside the wheel, else this
    environment's), else setup.py's DEFAULT_ARCHS."""
    stamp = os.path.join(ROOT, "dist", "fsdpcomp-build.json")
    env = os.environ.get("FSDPCOMP_CUDA_ARCHS")
    if os.path.exists(stamp):
        with open(stamp) as f:
            env = json.load(f)["env"].get("FSDPCOMP_CUDA_ARCHS")
    if not env:
        with open(os.path.join(ROOT, "setup.py")) as f:
            env = re.search(r'^DEFAULT_ARCHS = "([^"]+)"', f.read(), re.M).group(1)
    return [a.strip() for a in env.replace(",", ";").split(";") if a.strip()]


def test_tags(wheel):
    name = os.path.basename(wheel)
    m = re.fullmatch(r"fsdpcomp-([\w.]+)-(cp310-abi3-manylinux_\d+_\d+_(?:x86_64|aarch64))\.whl", name)
    assert m, f"{name}: not one cp310-abi3 manylinux wheel (setup.py py_limited_api, auditwheel repair)"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"fsdpcomp-{m.group(1)}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in meta, meta
    assert re.findall(r"^Tag: (\S+)$", meta, re.M) == [m.group(2)], meta


def test_requires_torch(wheel):
    """The wheel's metadata requires the torch range pyproject.toml names (what pip checks and
    `pip show` prints); .ci/setup installs the pinned torch first and the wheel with --no-deps."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    with zipfile.ZipFile(wheel) as z:
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    required = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M) if "extra ==" not in r]
    assert [(r.name, r.specifier) for r in required] == [(r.name, r.specifier) for r in declared], meta
    assert [r.name for r in required] == ["torch"], meta


def test_contents(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert [n for n in names if re.fullmatch(r"fsdpcomp/_C\..*so", n)] == ["fsdpcomp/_C.abi3.so"], sorted(names)
    sources = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "fsdpcomp", "**", "*.py"),
                                                           recursive=True)}
    assert sources and sources <= names, sorted(sources - names)
    assert not [n for n in names if NOT_VENDORED.search(os.path.basename(n))], sorted(names)
    if HAVE_NVCC and not CPU_ONLY_BUILD:
        assert CUDA_LIB in names, f"nvcc is here but {wheel} has no {CUDA_LIB}"


def test_cuda_library_archs(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        if CUDA_LIB not in z.namelist():
            pytest.skip("a wheel built without CUDA")
        lib = z.extract(CUDA_LIB, tmp_path)
    archs = [int(a) for a in expected_archs()]
    entries = fatbin_entries(lib)
    assert sorted(sm for kind, sm in entries if kind == "elf") == sorted(archs), entries
    assert [sm for kind, sm in entries if kind == "ptx"] == [archs[-1]], entries  # PTX for newer GPUs
    readelf = shutil.which("readelf")
    if readelf:  # cudart is static, the driver found at run time; NCCL is torch's alone
        needed = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True).stdout
        assert "(NEEDED)" in needed and not NOT_VENDORED.search(" ".join(re.findall(r"\[(.*?)\]", needed))), needed


# Runs in the fresh environment, from a directory without fsdpcomp in it.
PROBE = r"""
import os, shutil, sys
import torch
import fsdpcomp
for tool in %r:
    assert shutil.which(tool) is None, f"{tool} is on PATH: {shutil.which(tool)}"
pkg = os.path.dirname(fsdpcomp.__file__)
assert pkg.startswith(sys.prefix + os.sep), (pkg, sys.prefix)
assert os.path.basename(fsdpcomp._C.__file__) == "_C.abi3.so", fsdpcomp._C.__file__
s = fsdpcomp._C.State("int8", {"block_size": 64, "error_feedback": False})
x = torch.randn(1000)
payload = torch.empty(s.payload_bytes(1000), dtype=torch.uint8)
n = s.compress(x, payload)
acc = torch.zeros(1000)
s.decompress(payload[:n], acc)
err = (acc - x).abs().max().item()
assert 0 < err <= x.abs().max().item() / 127, err
info = fsdpcomp._C.cuda_info()
assert os.path.dirname(info["path"]) == pkg, info
print("cuda", info["available"], info["build"])
"""


def test_installs_in_fresh_venv_without_compiler(wheel, tmp_path):
    venv = tmp_path / "venv"
    # torch from the system site (the pinned CPU wheel is large); fsdpcomp only from the wheel:
    # the venv's own site-packages come first on sys.path
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=str(venv / "bin"), CC="/nonexistent/cc", CXX="/nonexistent/c++", NVCC="/nonexistent/nvcc",
               CUDA_HOME="/nonexistent")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-index", "--no-deps",
                          "--only-binary=:all:", "--force-reinstall", "-q", wheel],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    r = subprocess.run([py, "-P", "-c", PROBE % (NO_COMPILER,)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with zipfile.ZipFile(wheel) as z:
        has_cuda = CUDA_LIB in z.namelist()
    # The wheel's CUDA library loads from the installed package without a GPU (cudart is static
    # and finds the driver only on the first CUDA call): its build line names the archs.
    if has_cuda:
        assert r.stdout.startswith("cuda True archs " + ",".join(expected_archs())), r.stdout
    else:
        assert r.stdout.startswith("cuda False"), r.stdout


def test_installs_in_other_cpythons(wheel, tmp_path):
    """pip takes the one cp310-abi3 wheel for every other CPython >= 3.10 here, and its _C works
    there (loaded from the install as fsdpcomp._C: these interpreters have no torch)."""
    pythons = other_cpythons()
    if not pythons:
        pytest.skip("no other CPython >= 3.10 on this machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    for (major, minor), exe in sorted(pythons.items()):
        venv = tmp_path / f"venv{major}{minor}"
        subprocess.run([exe, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
        py = str(venv / "bin" / "python")
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-index", "--no-deps",
                              "--only-binary=:all:", "-q", wheel], capture_output=True, text=True, env=env,
                             timeout=600)
        assert pip.returncode == 0, f"{exe}: {pip.stdout}{pip.stderr}"
        lib = glob.glob(str(venv / "lib" / f"python{major}.{minor}" / "site-packages" / "fsdpcomp" / "_C*.so"))
        assert [os.path.basename(p) for p in lib] == ["_C.abi3.so"], lib
        r = subprocess.run([py, "-c", ABI3_PROBE, lib[0]], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith(f"{major}.{minor} "), f"{exe}: {r.stdout}{r.stderr}"


def test_sdist_has_every_source(wheel):
    """The wheel is built from the sdist (.ci/wheel): every tracked file of csrc/ and cuda/ must
    be in it (MANIFEST.in), or a wheel built from it silently lacks the CUDA library."""
    found = glob.glob(os.path.join(os.path.dirname(wheel), "fsdpcomp-*.tar.gz"))
    if not found:
        pytest.skip("no sdist beside the wheel")
    git = shutil.which("git")
    if git is None or not os.path.exists(os.path.join(ROOT, ".git")):  # a worktree's .git is a file
        pytest.skip("not a git checkout")
    tracked = subprocess.run([git, "ls-files", "csrc", "cuda"], capture_output=True, text=True, cwd=ROOT,
                             check=True).stdout.split()
    with tarfile.open(max(found, key=os.path.getmtime)) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert tracked and set(tracked) <= names, sorted(set(tracked) - names)
