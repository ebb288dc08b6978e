"""Which of the wheel's two CUDA libraries a driver gets (issue 40): _fsdpcomp_cuda.so (CUDA 13,
drivers of the 580 branch on) or _fsdpcomp_cuda12.so (CUDA 12.9, any driver supporting CUDA 12:
525.60.13 on). No GPU here: the driver's CUDA version is faked (FSDPCOMP_FAKE_CUDA_DRIVER_VERSION),
and the libraries are files carrying nvcc's release mark, all the choice reads from them (the
kernels themselves are the same source for both: tests/cuda_emu runs that source on the CPU; no
CUDA binary runs here)."""
import os
import subprocess
import sys

import pytest
import torch

import fsdpcomp
from fsdpcomp import _cuda_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "\x7fELF...Cuda compilation tools, release {}, V{}.86\n..."


class _ReportsCuda(torch.Tensor):
    @property
    def device(self):
        return torch.device("cuda", 0)


@pytest.fixture
def libs(tmp_path, monkeypatch):
    """A folder holding both libraries (as nvcc's marks), made the one fsdpcomp looks in."""
    monkeypatch.delenv("FSDPCOMP_CUDA_LIB", raising=False)
    monkeypatch.delenv("FSDPCOMP_CUDA_LIBRARY", raising=False)
    monkeypatch.setattr(_cuda_check, "library_dir", lambda: str(tmp_path))
    (tmp_path / "_fsdpcomp_cuda.so").write_bytes(MARK.format("13.0", "13.0").encode())
    (tmp_path / "_fsdpcomp_cuda12.so").write_bytes(MARK.format("12.9", "12.9").encode())
    return tmp_path


@pytest.mark.parametrize("driver, chosen", [(12020, "_fsdpcomp_cuda12.so"), (12080, "_fsdpcomp_cuda12.so"),
                                            (13000, "_fsdpcomp_cuda.so"), (13020, "_fsdpcomp_cuda.so")])
def test_newest_library_the_driver_runs(libs, monkeypatch, driver, chosen):
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", str(driver))
    path = _cuda_check.library_path()
    assert path == str(libs / chosen)
    # 12.2 runs the 12.9 library: CUDA 12's minor-version compatibility (cubins, static cudart)
    assert _cuda_check.cuda_problem("x is", path=path, built=_cuda_check.library_cuda_version(path),
                                    driver=driver) is None
    assert _cuda_check.library_name(path) == ("cu12" if "12" in chosen else "cu13")


def test_unknown_driver_gets_the_newest(libs):
    assert _cuda_check.choose_library(None) == str(libs / "_fsdpcomp_cuda.so")


def test_cuda_11_driver_runs_neither(libs, monkeypatch):
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", "11080")
    with pytest.raises(fsdpcomp.CudaError) as e:
        fsdpcomp.CommState("int8").all_reduce(torch.randn(8).as_subclass(_ReportsCuda))
    msg = str(e.value)
    # the message names the smaller upgrade: the CUDA 12 library's driver, not the 580 branch
    assert "_fsdpcomp_cuda12.so" in msg and "built with CUDA 12.9" in msg, msg
    assert "supports CUDA up to 11.8" in msg and "Upgrade the driver to 525.60.13 or newer" in msg, msg


def test_12x_driver_without_the_cuda12_library(libs, monkeypatch):
    (libs / "_fsdpcomp_cuda12.so").unlink()
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", "12080")
    assert _cuda_check.library_path() == str(libs / "_fsdpcomp_cuda.so")
    with pytest.raises(fsdpcomp.CudaError, match=r"built with CUDA 13\.0, which needs an NVIDIA driver >= 580"):
        fsdpcomp.CommState("int8").all_reduce(torch.randn(8).as_subclass(_ReportsCuda))


def test_forced_library(libs, monkeypatch):
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", "13000")
    monkeypatch.setenv("FSDPCOMP_CUDA_LIBRARY", "cu12")
    assert _cuda_check.library_path() == str(libs / "_fsdpcomp_cuda12.so")
    monkeypatch.setenv("FSDPCOMP_CUDA_LIBRARY", "cu14")
    with pytest.raises(ValueError, match="FSDPCOMP_CUDA_LIBRARY must be one of cu13, cu12, got 'cu14'"):
        _cuda_check.library_path()
    (libs / "_fsdpcomp_cuda12.so").unlink()
    monkeypatch.setenv("FSDPCOMP_CUDA_LIBRARY", "cu12")
    with pytest.raises(fsdpcomp.CudaError, match=r"FSDPCOMP_CUDA_LIBRARY=cu12 asks for .*_fsdpcomp_cuda12\.so, "
                                                 r"which this build does not have \(it has: cu13\)"):
        fsdpcomp.CommState("int8").all_reduce(torch.randn(8).as_subclass(_ReportsCuda))


def test_cuda_lib_path_wins(libs, monkeypatch, tmp_path):
    monkeypatch.setenv("FSDPCOMP_CUDA_LIB", str(tmp_path / "emulated.so"))
    monkeypatch.setenv("FSDPCOMP_CUDA_LIBRARY", "cu12")
    assert _cuda_check.choose_library(12080) == str(tmp_path / "emulated.so")
    assert _cuda_check.library_name(str(tmp_path / "emulated.so")) is None


def _run(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("FSDPCOMP_CUDA_LIB")}
    full.update(env, PYTHONPATH=os.pathsep.join([ROOT] + sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()


# _C alone, without the package (and so without torch's import: these subprocesses start fast)
BARE_C = ("import importlib.util, sys\n"
          "spec = importlib.util.spec_from_file_location('fsdpcomp._C', %r)\n"
          "C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)\n"
          "assert 'torch' not in sys.modules\n" % fsdpcomp._C.__file__)


def test_loader_opens_the_chosen_file(tmp_path):
    """_C's loader (csrc/backend_cuda/fc_cuda_loader.c) opens the file fsdpcomp chose, once."""
    chosen = str(tmp_path / "chosen.so")
    out = _run(BARE_C + f"print(C._cuda_choose({chosen!r}))\n"
               "i = C.cuda_info(); print(i['path'], i['available'], 'chosen.so' in i['error'])\n"
               "print(C._cuda_choose('/elsewhere.so'), C.cuda_info()['path'])\n"
               "for bad in (5, ''):\n"
               "    try: C._cuda_choose(bad)\n"
               "    except (TypeError, ValueError) as e: print(type(e).__name__)\n")
    assert out == ["True", chosen, "False", "True", "False", chosen, "TypeError", "ValueError"]


@pytest.mark.parametrize("forced, file", [("cu12", "_fsdpcomp_cuda12.so"), ("cu13", "_fsdpcomp_cuda.so")])
def test_loader_reads_the_forced_name(forced, file):
    """_C.cuda_info() called first (tests, tools) opens the forced file too."""
    out = _run(BARE_C + "import os; print(os.path.basename(C.cuda_info()['path']))",
               FSDPCOMP_CUDA_LIBRARY=forced)
    assert out == [file]


def test_loader_refuses_another_name():
    out = _run(BARE_C + "i = C.cuda_info(); print(i['available'], '|', i['error'])",
               FSDPCOMP_CUDA_LIBRARY="cu11")
    assert out[:2] == ["False", "|"] and " ".join(out[2:]) == "FSDPCOMP_CUDA_LIBRARY must be cu13 or cu12, got 'cu11'"


def test_a_12x_driver_loads_the_cuda12_file(tmp_path):
    """End to end on the real CUDA library (loads without a GPU: cudart is static and finds the
    driver only on its first call): copied in as both files, the CUDA 12 copy's nvcc mark made
    12.9 (same length), a faked 12.8 driver gets _C to dlopen the CUDA 12 file, 13.0 the other."""
    real = os.path.join(os.path.dirname(fsdpcomp._C.__file__), "_fsdpcomp_cuda.so")
    if not os.path.exists(real):
        pytest.skip("a build without the CUDA library")
    data = open(real, "rb").read()
    mark = _cuda_check._NVCC_MARK.search(data)
    (tmp_path / "_fsdpcomp_cuda.so").write_bytes(data)
    (tmp_path / "_fsdpcomp_cuda12.so").write_bytes(
        data[:mark.start()] + data[mark.start():].replace(mark.group(0), b"Cuda compilation tools, release 12.9"))
    code = ("import fsdpcomp, os; fsdpcomp._cuda_check.library_dir = lambda: %r\n"
            "i = fsdpcomp.cuda_info(); print(os.path.basename(i['path']), i['available'], i['library'], "
            "fsdpcomp._cuda_check.loaded_library(), i['driver_cuda_version'], *i['built'])" % str(tmp_path))
    assert _run(code, FSDPCOMP_FAKE_CUDA_DRIVER_VERSION="12080") == [
        "_fsdpcomp_cuda12.so", "True", "cu12", "cu12", "12080", "cu12", "cu13"]
    assert _run(code, FSDPCOMP_FAKE_CUDA_DRIVER_VERSION="13000") == [
        "_fsdpcomp_cuda.so", "True", "cu13", "cu13", "13000", "cu12", "cu13"]


def test_cuda_info_without_a_library():
    """A build without CUDA: cuda_info says which library it would have loaded, and why not."""
    if _cuda_check.built_libraries() or os.environ.get("FSDPCOMP_CUDA_LIB"):
        pytest.skip("this build has a CUDA library (the test above loads it, in a subprocess)")
    info = fsdpcomp.cuda_info()
    assert info["available"] is False and info["library"] == "cu13" and info["built"] == [], info
