"""The CUDA part as CI can check it without a GPU: the library is built where nvcc is, exports
only its function table, is not loaded by `import fsdpcomp`, and loads without a GPU."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers.pkg_path import PKG_DIR, pythonpath

LIB = os.path.join(PKG_DIR, "_fsdpcomp_cuda.so")
HAVE_NVCC = bool(os.environ.get("NVCC") or shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))
CPU_ONLY_BUILD = os.environ.get("FSDPCOMP_CUDA", "auto").strip().lower() in ("0", "off", "no", "false")


def run_py(code: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath(), **extra_env)
    # cwd elsewhere: `python -c` puts the current directory first on sys.path
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tempfile.gettempdir())


def need_lib():
    if os.path.exists(LIB):
        return
    if HAVE_NVCC and not CPU_ONLY_BUILD:
        pytest.fail(f"nvcc is present but {LIB} was not built (pip install . or python setup.py build_ext --inplace)")
    pytest.skip("no CUDA library in this build (no nvcc, or FSDPCOMP_CUDA=0)")


def test_library_exports_only_the_table():
    need_lib()
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not installed")
    out = subprocess.run([nm, "-D", "--defined-only", LIB], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == ["fc_cuda_get_api"], names  # static cudart stays private: no clash with torch's


def cuda_abi() -> int:
    """FC_CUDA_ABI as csrc/backend_cuda/fc_cuda.h defines it: the one number _C and the library must share."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's
    with open(os.path.join(root, "csrc", "backend_cuda", "fc_cuda.h")) as f:
        m = re.search(r"#define FC_CUDA_ABI (\d+)", f.read())
    assert m, "FC_CUDA_ABI not found in csrc/backend_cuda/fc_cuda.h"
    return int(m.group(1))


def test_table_answers_only_its_abi():
    need_lib()
    abi = cuda_abi()
    r = run_py(
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({LIB!r})\n"
        "f = lib.fc_cuda_get_api; f.restype = ctypes.c_void_p; f.argtypes = [ctypes.c_int]\n"
        f"assert f({abi}) is not None and f({abi - 1}) is None and f(999) is None\n"
        f"print(ctypes.c_int.from_address(f({abi})).value)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(abi)


def test_import_does_not_load_cuda():
    r = run_py(
        "import fsdpcomp, torch\n"
        "from fsdpcomp import _C\n"
        "s = fsdpcomp.CommState('int8', {'error_feedback': True})\n"
        "g = torch.randn(4096); o = torch.empty(4096)\n"
        "s.reduce_scatter(g, o); s.end_step(); s.counters()\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(_C.cuda_loaded(), '_fsdpcomp_cuda' in maps)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_cuda_info_loads_without_a_gpu():
    need_lib()
    r = run_py(
        "from fsdpcomp import _C\n"
        "info = _C.cuda_info()\n"
        "print(info['available'], info['error'])\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("True"), r.stdout  # loads without a GPU or driver


def test_cuda_flag_matches_the_library_table():
    """method_info(m)["cuda"] is what the built library's has_method answers (fc_cuda_api's third
    field, read through ctypes in a subprocess: no GPU needed), and False for all without it."""
    import fsdpcomp
    flags = {m: fsdpcomp.method_info(m)["cuda"] for m in fsdpcomp.codecs()}
    if not os.path.exists(LIB):
        if HAVE_NVCC and not CPU_ONLY_BUILD:
            need_lib()
        assert not any(flags.values()), flags
        return
    ids = {m: fsdpcomp.method_info(m)["id"] for m in fsdpcomp.codecs()}
    r = run_py(
        "import ctypes\n"
        f"lib = ctypes.CDLL({LIB!r})\n"
        "class Api(ctypes.Structure):\n"
        "    _fields_ = [('abi', ctypes.c_int), ('build', ctypes.c_char_p),\n"
        "                ('has_method', ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int))]\n"
        "f = lib.fc_cuda_get_api; f.restype = ctypes.POINTER(Api); f.argtypes = [ctypes.c_int]\n"
        f"api = f({cuda_abi()}).contents\n"
        f"print(' '.join(str(api.has_method(i)) for i in {sorted(ids.values())!r}))\n")
    assert r.returncode == 0, r.stderr
    has = dict(zip(sorted(ids.values()), (bool(int(v)) for v in r.stdout.split())))
    assert flags == {m: has[ids[m]] for m in flags}


def test_cuda_flag_is_false_without_the_library():
    r = run_py("import fsdpcomp\nprint(any(fsdpcomp.method_info(m)['cuda'] for m in fsdpcomp.codecs()))",
               FSDPCOMP_CUDA_LIB=os.path.join(tempfile.gettempdir(), "no", "_fsdpcomp_cuda.so"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
