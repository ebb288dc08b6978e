"""A GPU user whose fsdpcomp cannot run on CUDA learns why and what to do before anything runs:
built without the CUDA library, or an NVIDIA driver older than the CUDA that library was built
with. Checked at ``register`` (the model's parameters on CUDA) and at the first CUDA tensor of
a CommState call. No GPU here: the driver's version is faked through the check's documented
seam (FSDPCOMP_FAKE_CUDA_DRIVER_VERSION), a real library comes from nvcc where it is installed,
and a CUDA tensor is a CPU tensor whose ``device`` says cuda:0 (the only property the checks
read before they refuse)."""
import os
import re
import shutil
import subprocess

import pytest
import torch

import fsdpcomp
from fsdpcomp import _cuda_check


class _ReportsCuda(torch.Tensor):
    @property
    def device(self):
        return torch.device("cuda", 0)


class _CudaParam(torch.nn.Parameter):
    @property
    def device(self):
        return torch.device("cuda", 0)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.w = _CudaParam(torch.randn(4))


def _cuda(n):
    return torch.randn(n).as_subclass(_ReportsCuda)


@pytest.fixture
def no_lib(tmp_path, monkeypatch):
    path = str(tmp_path / "missing" / "_fsdpcomp_cuda.so")
    monkeypatch.setenv("FSDPCOMP_CUDA_LIB", path)
    return path


@pytest.fixture(scope="module")
def nvcc_lib(tmp_path_factory):
    """A real library from nvcc (the CUDA the test machine's toolkit is), and that CUDA's (major, minor)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    d = tmp_path_factory.mktemp("nvcc")
    src, lib = d / "k.cu", d / "_fsdpcomp_cuda.so"
    src.write_text('__global__ void k(float *x) { x[0] = 1.0f; }\n'
                   'extern "C" void run(float *x) { k<<<1, 1>>>(x); }\n')
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart", "static", "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    release = re.search(r"release (\d+)\.(\d+)", subprocess.run([nvcc, "--version"], capture_output=True,
                                                               text=True, check=True).stdout)
    return str(lib), (int(release.group(1)), int(release.group(2)))


def test_register_names_a_build_without_cuda_before_anything(no_lib):
    model = _Net()
    with pytest.raises(fsdpcomp.CudaError) as e:
        fsdpcomp.register(model, "int8")  # a plain Module: TypeError, had the check not come first
    msg = str(e.value)
    assert "_Net's parameters are on a CUDA device" in msg and "built without CUDA" in msg, msg
    assert f"FSDPCOMP_CUDA_LIB={no_lib} does not exist" in msg and "nvcc on PATH" in msg, msg
    assert "FSDPCOMP_CUDA=1" in msg, msg
    assert not model._forward_hooks and not model._backward_hooks
    with pytest.raises(TypeError, match="does not know how to attach"):
        fsdpcomp.register(torch.nn.Linear(4, 4), "int8")  # CPU parameters: no CUDA check


def test_default_library_path_is_named():
    path = _cuda_check.library_path()
    if "FSDPCOMP_CUDA_LIB" in os.environ or os.path.exists(path):
        pytest.skip("this build has a CUDA library (or FSDPCOMP_CUDA_LIB is set)")
    with pytest.raises(fsdpcomp.CudaError, match=f"built without CUDA \\(there is no {re.escape(path)}\\)"):
        fsdpcomp.register(_Net())
    assert fsdpcomp.method_info("int8")["cuda"] is False


@pytest.mark.parametrize("call", ["reduce_scatter", "all_reduce", "all_gather_params"])
def test_first_cuda_tensor_of_a_commstate_call(no_lib, call):
    state = fsdpcomp.CommState("int8", {"block_size": 64})
    before = dict(state.counters())
    with pytest.raises(fsdpcomp.CudaError, match=r"(grad|shard) is on a CUDA device, but this fsdpcomp "
                                                   r"was built without CUDA"):
        if call == "reduce_scatter":
            state.reduce_scatter(_cuda(256), _cuda(256))
        elif call == "all_reduce":
            state.all_reduce(_cuda(256))
        else:
            state.all_gather_params(_cuda(256), _cuda(256))
    assert state.step == 0 and state.unit_keys == () and dict(state.counters()) == before


def test_old_driver_named_at_register(nvcc_lib, monkeypatch):
    lib, (major, minor) = nvcc_lib
    assert _cuda_check.library_cuda_version(lib) == (major, minor)
    monkeypatch.setenv("FSDPCOMP_CUDA_LIB", lib)
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", str((major - 1) * 1000 + 80))
    with pytest.raises(fsdpcomp.CudaError) as e:
        fsdpcomp.register(_Net(), "int8")
    msg = str(e.value)
    assert f"was built with CUDA {major}.{minor}" in msg and lib in msg, msg
    assert f"supports CUDA up to {major - 1}.8" in msg and "Upgrade the driver" in msg, msg
    if major == 13:
        assert "needs an NVIDIA driver >= 580" in msg and "to 580 or newer" in msg, msg
    with pytest.raises(fsdpcomp.CudaError, match="grad is on a CUDA device, but fsdpcomp's CUDA library"):
        fsdpcomp.CommState("int8").all_reduce(_cuda(64))
    # a driver of the library's CUDA passes the check: register goes on to the model's type
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", str(major * 1000))
    with pytest.raises(TypeError, match="does not know how to attach to _Net"):
        fsdpcomp.register(_Net(), "int8")


def test_problem_messages(tmp_path):
    lib = tmp_path / "_fsdpcomp_cuda.so"
    lib.write_bytes(b"\x7fELF...Cuda compilation tools, release 13.0, V13.0.88\n...")
    path = str(lib)
    msg = _cuda_check.cuda_problem("x is", path=path, built=(13, 0), driver=12040, release="550.54.15")
    assert msg == (f"x is on a CUDA device, but fsdpcomp's CUDA library ({path}) was built with CUDA 13.0, "
                   "which needs an NVIDIA driver >= 580, and the installed NVIDIA driver (550.54.15) supports "
                   "CUDA up to 12.4. Upgrade the driver to 580 or newer, or rebuild fsdpcomp with a CUDA "
                   "toolkit of at most 12.4 (its nvcc first on PATH, FSDPCOMP_CUDA=1).")
    assert "needs an NVIDIA driver that supports CUDA 14" in _cuda_check.cuda_problem(
        "x is", path=path, built=(14, 1), driver=13000)
    for built, driver in [((13, 0), 13000), ((13, 2), 13000), ((12, 8), 13010), (None, 12040), ((13, 0), None)]:
        assert _cuda_check.cuda_problem("x is", path=path, built=built, driver=driver) is None, (built, driver)
    assert _cuda_check.library_cuda_version(path) == (13, 0)


@pytest.mark.parametrize("line", [
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Feb 28 09:47:01 UTC 2025",
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16)"])
def test_driver_release_from_proc(tmp_path, line):
    proc = tmp_path / "version"
    proc.write_text(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert _cuda_check.driver_release(str(proc)) == "570.133.20"
    assert _cuda_check.driver_release(str(tmp_path / "absent")) is None


def test_library_version_without_nvcc_mark(tmp_path):
    empty, plain = tmp_path / "empty.so", tmp_path / "plain.so"
    empty.write_bytes(b"")
    plain.write_bytes(os.urandom(4096).replace(b"Cuda", b"cuda"))
    for p in (empty, plain, tmp_path / "absent.so"):
        assert _cuda_check.library_cuda_version(str(p)) is None


def test_fake_driver_version_must_be_a_number(nvcc_lib, monkeypatch):
    monkeypatch.setenv("FSDPCOMP_CUDA_LIB", nvcc_lib[0])
    monkeypatch.setenv("FSDPCOMP_FAKE_CUDA_DRIVER_VERSION", "580.65")
    with pytest.raises(ValueError, match="FSDPCOMP_FAKE_CUDA_DRIVER_VERSION must be an integer like 12080, "
                                         "got '580.65'"):
        fsdpcomp.CommState("none").all_reduce(_cuda(8))
