"""Registers of the lean one-pass encode kernels and of the fused decodes (cuda/fc_cu_decode.cuh:
the collective's and decompress()'s of every dense method), as ptxas allocates them for sm_90
with the build's flags (setup.py's nvcc): at most 64 per thread and no spills, so that four
blocks of 256 threads stay resident on an SM (their __launch_bounds__(256, 4) caps them at 64:
over that they spill, which this test refuses). A CPU test: it needs nvcc, not a GPU.

Compiled: the dense codecs' lean kernels instantiated alone from fc_cu_dense.cuh (the kernel files'
templates; their error-feedback and sampled kernels are the slow part of fc_cu_blocks.cu and are
not asserted), and fc_cu_signsgd.cu and fc_cu_cast.cu whole, side by side."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC = next((c for c in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc")
             if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)
FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-arch=sm_90", "-Xptxas", "-v",
         "-I" + os.path.join(ROOT, "csrc"), "-I" + os.path.join(ROOT, "cuda")]
MAX_REGS = 64

CODECS = ["fc_cu_int8_codec", "fc_cu_fp8_codec", "fc_cu_intn_codec", "fc_cu_qsgd_codec", "fc_cu_nc_codec",
          "fc_cu_onebit_codec"]
LEAN = {0: "FC_CU_LEAN_F32", 1: "FC_CU_LEAN_BF16"}  # fc_cu_onepass.cuh's kinds
# every lean encode kernel, by its demangled name up to the parameter list
EXPECTED = (
    [f"void fc_cu_encode_dense<{c}, {k}>" for c in CODECS + ["sign_scaled_codec", "sign_vote_codec"] for k in LEAN]
    + [f"void cast_encode<{m}, {w}, {k}>" for m, w, k in (("none_code<0>", 4, 0), ("none_code<1>", 2, 1))]
    + [f"void cast_encode<{m}, 2, {k}>" for m in ("fc_cu_fp16_code", "bf16_code") for k in LEAN])
# every fused decode kernel: the block codecs' (instantiated below) and the casts' (fc_cu_cast.cu)
DECODES = [f"void fc_cu_{kind}_fused<{v}{' ' if v.endswith('>') else ''}>" for kind in ("decode", "decompress")
           for v in [f"{c}::dec" for c in CODECS] + ["none_code<-1>", "fc_cu_fp16_code", "bf16_code"]]

if NVCC is None:
    pytest.skip("no nvcc: the register check compiles the kernels for sm_90", allow_module_level=True)


def demangle(names: list[str]) -> list[str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        pytest.skip("no c++filt to read the kernel names")
    r = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def ptxas_table(outputs: list[str]) -> dict[str, dict]:
    """{demangled kernel name up to its parameters: {"regs", "spill_stores", "spill_loads"}} from
    -Xptxas -v output: a 'Compiling entry function' line, its stack/spill line, its 'Used' line."""
    rows, name = {}, None
    for text in outputs:
        for line in text.splitlines():
            m = re.search(r"Compiling entry function '([^']+)' for 'sm_90'", line)
            if m:
                name = m.group(1)
                rows[name] = {}
                continue
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and name:
                rows[name].update(spill_stores=int(m.group(1)), spill_loads=int(m.group(2)))
            m = re.search(r"Used (\d+) registers", line)
            if m and name:
                rows[name]["regs"] = int(m.group(1))
    mangled = list(rows)
    return {d.split("(")[0]: rows[m] for m, d in zip(mangled, demangle(mangled))}


def compile_all(tmp: str) -> list[str]:
    tu = os.path.join(tmp, "lean_dense.cu")
    with open(tu, "w") as f:
        f.write('#include "fc_cu_dense.cuh"\n')
        for c in CODECS:
            for k in LEAN.values():
                f.write(f"template __global__ void fc_cu_encode_dense<{c}, {k}>(fc_cu_enc, {c});\n")
            for kind in ("decode", "decompress"):
                f.write(f"template __global__ void fc_cu_{kind}_fused<{c}::dec>(fc_cu_dec, {c}::dec);\n")
    srcs = [tu, os.path.join(ROOT, "cuda", "fc_cu_signsgd.cu"), os.path.join(ROOT, "cuda", "fc_cu_cast.cu")]
    procs = [subprocess.Popen([NVCC, "-c", s, "-o", os.path.join(tmp, f"{i}.o")] + FLAGS, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i, s in enumerate(srcs)]
    outs = []
    for s, p in zip(srcs, procs):
        out = p.communicate(timeout=900)[0]
        assert p.returncode == 0, f"nvcc failed on {s}:\n{out[-4000:]}"
        outs.append(out)
    return outs


@pytest.fixture(scope="module")
def table():
    with tempfile.TemporaryDirectory() as tmp:
        return ptxas_table(compile_all(tmp))


KERNELS = list(EXPECTED) + DECODES  # the lean encodes and the fused decodes, held to one budget


def test_every_lean_kernel_is_compiled(table):
    """A kernel renamed or no longer instantiated would pass the checks below by absence."""
    missing = [k for k in KERNELS if k not in table]
    assert not missing, f"lean kernels not found in ptxas' output: {missing}; found {sorted(table)}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_lean_kernel_fits_64_registers_without_spills(table, kernel):
    row = table.get(kernel)
    if row is None:
        pytest.fail(f"{kernel} not compiled")
    assert row.get("regs", 10**6) <= MAX_REGS, f"{kernel}: {row}"
    assert row.get("spill_stores") == 0 and row.get("spill_loads") == 0, f"{kernel} spills: {row}"
